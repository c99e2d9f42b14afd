"""``databus init``'s files, without a server: passwords become ``${NAME}`` references,
the three files load as configs, and a file with other contents is not overwritten
without ``force``."""

from __future__ import annotations

from pathlib import Path

import pytest

from databus.config import load_config
from databus.init._configs import render, write
from databus.init._model import Inspection, password_to_reference


@pytest.mark.parametrize(("uri", "expected"), [
    ("mysql://repl:s3cret@h:3306/shop", "mysql://repl:${V}@h:3306/shop"),
    ("mysql://repl:a%40b@h/shop?tables=shop.t", "mysql://repl:${V}@h/shop?tables=shop.t"),
    ("postgresql://u:p@ss/w@h/db", "postgresql://u:${V}@h/db"),  # an unencoded '@' too
])
def test_the_password_becomes_a_reference(uri: str, expected: str) -> None:
    assert password_to_reference(uri, "V") == (expected, True)


def test_a_uri_without_password_is_kept() -> None:
    assert password_to_reference("postgresql://u@h/db", "V") == ("postgresql://u@h/db", False)
    assert password_to_reference("sqlite:///a/b.db", "V") == ("sqlite:///a/b.db", False)


def _inspection() -> Inspection:
    found = Inspection("mysql", buffer="shop")
    found.tables = ["shop.orders", "shop.items", "other.items"]
    return found


def test_the_files_load_and_hold_no_password(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    configs = render(_inspection(), "mysql://repl:Zq81vv@127.0.0.1:3306/shop", tmp_path,
                     relay_port=12345, bootstrap_port=12346,
                     bootstrap_storage="postgresql://boot:Bx72kk@127.0.0.1/boot",
                     target="postgresql://rep:Tg55mm@127.0.0.1/warehouse")
    assert set(configs.env) == {"DATABUS_SOURCE_PASSWORD", "DATABUS_ADMIN_TOKEN",
                                "DATABUS_BOOTSTRAP_PASSWORD", "DATABUS_TARGET_PASSWORD"}
    for text in configs.files.values():
        assert "Zq81vv" not in text and "Bx72kk" not in text and "Tg55mm" not in text
    assert write(configs, tmp_path, force=False) == (list(configs.files), [])
    for name in configs.env:
        monkeypatch.setenv(name, "from-env")
    relay = load_config(tmp_path / "relay.toml").relay
    assert relay is not None and relay.port == 12345
    assert relay.buffers[0].source == "mysql://repl:from-env@127.0.0.1:3306/shop"
    replicate = load_config(tmp_path / "replicate.toml").replicate
    assert replicate is not None
    # Two sources named items: the second one's target says its database.
    assert [(t.source, t.target) for t in replicate.tables] == [
        ("shop.orders", ""), ("shop.items", "shop_items"), ("other.items", "other_items")]
    assert load_config(tmp_path / "bootstrap.toml").bootstrap is not None


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path) -> None:
    configs = render(_inspection(), "mysql://repl@h/shop", tmp_path, relay_port=1,
                     bootstrap_port=2, bootstrap_storage=None, target=None)
    assert "DATABUS_SOURCE_PASSWORD" not in configs.env
    assert write(configs, tmp_path, force=False)[1] == []
    assert write(configs, tmp_path, force=False)[1] == []  # the same contents: fine
    (tmp_path / "relay.toml").write_text("# mine\n")
    assert write(configs, tmp_path, force=False) == ([], ["relay.toml"])
    assert (tmp_path / "relay.toml").read_text() == "# mine\n"
    assert write(configs, tmp_path, force=True)[1] == []
    assert (tmp_path / "relay.toml").read_text() == configs.files["relay.toml"]
