"""TOML config loading: the generic dataclass loader, interpolation, secrets, the relay."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus.config import (
    BufferConfig,
    ConfigFieldError,
    DatabusConfig,
    RelayConfig,
    Secret,
    check_name,
    check_range,
    describe,
    from_mapping,
    load_config,
    load_toml,
    redact_uri,
)
from databus.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "relay.toml"
ENV = {"DATABUS_ADMIN_TOKEN": "adm1n-t0ken", "MYSQL_PASSWORD": "hunter2-very-secret"}

MINIMAL = """
[relay]
data_dir = "/tmp/relay"

[[relay.buffers]]
name = "a"
capacity_mb = 8
source = "synthetic://?rate=1"
"""


def write(tmp_path: Path, text: str, name: str = "relay.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str, env: Mapping[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env=env or {})
    return info.value.message


# --- the relay config ------------------------------------------------------------------


def test_example_relay_config_loads() -> None:
    config = load_config(EXAMPLE, env=ENV)
    relay = config.relay
    assert relay is not None
    assert (relay.host, relay.port) == ("127.0.0.1", 11190)
    assert relay.data_dir == Path("/var/lib/databus/relay")
    assert relay.admin_token is not None and relay.admin_token.reveal() == "adm1n-t0ken"
    assert [b.name for b in relay.buffers] == ["shop", "load"]
    shop = relay.buffers[0]
    assert shop.capacity_mb == 256 and shop.capacity_bytes == 256 << 20
    assert shop.source == (
        "mysql://repl:hunter2-very-secret@127.0.0.1:3306/"
        "?server_id=1001&tables=shop.orders,shop.items"
    )
    assert relay.buffer("load") is relay.buffers[1] and relay.buffer("nope") is None
    for text in (repr(config), str(config), repr(relay), repr(shop), f"{config}"):
        assert "hunter2" not in text and "adm1n" not in text
    assert "mysql://repl:***@127.0.0.1:3306/" in repr(config)


def test_example_relay_config_without_env_names_the_variable_file_and_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, env={"MYSQL_PASSWORD": "x"})
    message = info.value.message
    assert message.startswith(f"{EXAMPLE}: relay.admin_token: ")
    assert "DATABUS_ADMIN_TOKEN" in message
    with pytest.raises(ConfigError, match=r"relay\.buffers\[0\]\.source: .*MYSQL_PASSWORD"):
        load_config(EXAMPLE, env={"DATABUS_ADMIN_TOKEN": "x"})


def test_defaults(tmp_path: Path) -> None:
    relay = load_config(write(tmp_path, MINIMAL), env={}).relay
    assert relay == RelayConfig(
        data_dir=Path("/tmp/relay"),
        buffers=(BufferConfig("a", 8, "synthetic://?rate=1"),),
    )
    assert relay.host == "127.0.0.1" and relay.port == 11190 and relay.admin_token is None
    assert relay.max_bytes_cap == 8 << 20 and relay.max_wait_ms == 60_000
    assert relay.buffers[0].index_every_bytes == 64 * 1024
    assert load_config(write(tmp_path, ""), env={}) == DatabusConfig(relay=None)


def test_configs_are_frozen(tmp_path: Path) -> None:
    relay = load_config(write(tmp_path, MINIMAL), env={}).relay
    assert relay is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        relay.port = 1  # type: ignore[misc]
    assert isinstance(relay.buffers, tuple)


def test_wrong_type_names_file_and_dotted_path(tmp_path: Path) -> None:
    text = MINIMAL + '\n[[relay.buffers]]\nname = "b"\ncapacity_mb = "64"\nsource = "x://"\n'
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.message == f"{path}: relay.buffers[1].capacity_mb: expected int, got str"


@pytest.mark.parametrize(
    ("replace", "by", "message"),
    [
        (
            "capacity_mb = 8",
            "capacity_mb = true",
            "relay.buffers[0].capacity_mb: expected int, got bool",
        ),
        (
            "capacity_mb = 8",
            "capacity_mb = 8.0",
            "relay.buffers[0].capacity_mb: expected int, got float",
        ),
        ('data_dir = "/tmp/relay"', "data_dir = 3", "relay.data_dir: expected str, got int"),
        ('data_dir = "/tmp/relay"', 'data_dir = ""', "relay.data_dir: must not be empty"),
        ("[relay]", "[relay]\nport = [1]", "relay.port: expected int, got array"),
        ("[relay]", "[relay]\nadmin_token = 5", "relay.admin_token: expected str, got int"),
        ("[relay]", "[relay]\nprot = 1", "relay.prot: unknown key (did you mean 'port'?"),
        (
            "capacity_mb = 8",
            "capacity_mb = 8\ncapcity_mb = 9",
            "relay.buffers[0].capcity_mb: unknown key",
        ),
        ("[relay]", "[relayy]\n[relay]", "relayy: unknown key (did you mean 'relay'?"),
        ('data_dir = "/tmp/relay"', "", "relay.data_dir: missing required key"),
        ('source = "synthetic://?rate=1"', "", "relay.buffers[0].source: missing required key"),
        ("[relay]", "[relay]\nport = 70000", "relay.port: must be at most 65535, got 70000"),
        ("[relay]", "[relay]\nport = -1", "relay.port: must be at least 0"),
        ("[relay]", '[relay]\nhost = ""', "relay.host: must be a non-empty"),
        ("[relay]", '[relay]\nadmin_token = ""', "relay.admin_token: must not be empty"),
        ("[relay]", "[relay]\nmax_wait_ms = -5", "relay.max_wait_ms: must be at least 0"),
        ("[relay]", "[relay]\nmax_bytes_cap = 10", "relay.max_bytes_cap: must be at least 1024"),
        ("capacity_mb = 8", "capacity_mb = 0", "relay.buffers[0].capacity_mb: must be at least 1"),
        ('name = "a"', 'name = ""', "relay.buffers[0].name: must not be empty"),
        ('name = "a"', 'name = "a b/c"', "relay.buffers[0].name: 'a b/c' is not a valid name"),
        (
            "capacity_mb = 8",
            "capacity_mb = 1\nindex_every_bytes = 1048576",
            "relay.buffers[0].index_every_bytes: must be smaller than the buffer",
        ),
        (
            "capacity_mb = 8",
            "capacity_mb = 8\nindex_every_bytes = 10",
            "index_every_bytes: must be at least 1024",
        ),
        (
            'source = "synthetic://?rate=1"',
            'source = "not a uri"',
            "relay.buffers[0].source: expected a URI",
        ),
    ],
)
def test_relay_config_errors(tmp_path: Path, replace: str, by: str, message: str) -> None:
    assert replace in MINIMAL
    got = load_error(tmp_path, MINIMAL.replace(replace, by, 1))
    assert got.startswith(str(tmp_path / "relay.toml") + ": ")
    assert message in got


def test_a_section_must_be_a_table(tmp_path: Path) -> None:
    assert load_error(tmp_path, "relay = 5\n").endswith(
        "relay.toml: relay: expected table, got int"
    )


def test_duplicate_buffer_names_point_at_the_second_one(tmp_path: Path) -> None:
    text = MINIMAL + '\n[[relay.buffers]]\nname = "a"\ncapacity_mb = 1\nsource = "x://"\n'
    assert "relay.buffers[1].name: duplicate buffer name 'a'" in load_error(tmp_path, text)


def test_a_relay_needs_buffers(tmp_path: Path) -> None:
    assert "relay.buffers: missing required key" in load_error(tmp_path, '[relay]\ndata_dir="d"\n')
    text = '[relay]\ndata_dir = "d"\nbuffers = []\n'
    assert "relay.buffers: a relay needs at least one" in load_error(tmp_path, text)


def test_source_uri_errors_do_not_quote_the_uri(tmp_path: Path) -> None:
    text = MINIMAL.replace('"synthetic://?rate=1"', '"repl:${PW}@host"')
    message = load_error(tmp_path, text, env={"PW": "topsecret"})
    assert "topsecret" not in message and "expected a URI" in message


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ConfigFieldError) as info:
        BufferConfig("ok", 0, "x://")
    assert info.value.field == "capacity_mb"
    assert info.value.reason == "must be at least 1, got 0"
    assert info.value.message == "capacity_mb: must be at least 1, got 0"
    buffers = (BufferConfig("a", 1, "x://"), BufferConfig("a", 1, "y://"))
    with pytest.raises(ConfigFieldError, match=r"buffers\[1\]\.name: duplicate"):
        RelayConfig(data_dir=Path("d"), buffers=buffers)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        load_config(write(tmp_path, "[relay\n", "bad.toml"))


# --- interpolation ---------------------------------------------------------------------


def with_token(tmp_path: Path, token: str, env: Mapping[str, str]) -> str:
    text = MINIMAL.replace("[relay]", f"[relay]\nadmin_token = {token!r}")
    relay = load_config(write(tmp_path, text), env=env).relay
    assert relay is not None and relay.admin_token is not None
    return relay.admin_token.reveal()


@pytest.mark.parametrize(
    ("token", "env", "expected"),
    [
        ("${T}", {"T": "abc"}, "abc"),
        ("x-${T}-${U}", {"T": "1", "U": "2"}, "x-1-2"),
        ("${T:-dflt}", {}, "dflt"),
        ("${T:-dflt}", {"T": ""}, "dflt"),
        ("${T:-dflt}", {"T": "set"}, "set"),
        ("${T:-a:-b}", {}, "a:-b"),
        ("p$${T}", {"T": "no"}, "p${T}"),
        ("pa$$word$", {}, "pa$$word$"),
        ("${T}", {"T": "${U}"}, "${U}"),
    ],
)
def test_interpolation(tmp_path: Path, token: str, env: dict[str, str], expected: str) -> None:
    assert with_token(tmp_path, token, env) == expected


def test_interpolation_reads_os_environ_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABUS_TEST_TOKEN", "from-env")
    text = MINIMAL.replace("[relay]", '[relay]\nadmin_token = "${DATABUS_TEST_TOKEN}"')
    relay = load_config(write(tmp_path, text)).relay
    assert relay is not None and relay.admin_token == Secret("from-env")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("${NOPE}", "relay.admin_token: environment variable NOPE is not set"),
        ("${NOPE", "relay.admin_token: unterminated ${"),
        ("${}", "relay.admin_token: invalid ${...} reference"),
        ("${1X}", "relay.admin_token: invalid ${...} reference"),
        ("${A B}", "relay.admin_token: invalid ${...} reference"),
    ],
)
def test_interpolation_errors(tmp_path: Path, token: str, message: str) -> None:
    text = MINIMAL.replace("[relay]", f"[relay]\nadmin_token = {token!r}")
    got = load_error(tmp_path, text)
    assert got.startswith(f"{tmp_path / 'relay.toml'}: ") and message in got


def test_interpolated_strings_can_fill_numbers_and_bools(tmp_path: Path) -> None:
    text = MINIMAL.replace("[relay]", '[relay]\nport = "${PORT:-1234}"')
    relay = load_config(write(tmp_path, text), env={}).relay
    assert relay is not None and relay.port == 1234
    got = load_error(tmp_path, text, env={"PORT": "s3cret"})
    assert "relay.port: expected int, got str (after ${...} interpolation)" in got
    assert "s3cret" not in got
    # Without interpolation a quoted number stays a type error.
    assert "expected int, got str" in load_error(
        tmp_path, MINIMAL.replace("[relay]", '[relay]\nport = "1"')
    )


# --- the generic loader ----------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Inner:
    x: int
    label: str = "inner"

    def __post_init__(self) -> None:
        check_range(self.x, "x", min=0, max=10)


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str
    ratio: float
    enabled: bool
    inner: Inner
    items: tuple[Inner, ...] = ()
    tags: list[str] = dataclasses.field(default_factory=list)
    pair: tuple[int, str] = (0, "")
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    options: Mapping[str, float] = dataclasses.field(default_factory=dict)
    maybe: int | None = None
    either: int | str = 0
    mode: Literal["fast", "safe"] = "safe"
    color: Color = Color.RED
    where: Path = Path("/")
    password: Secret | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "name")


def build(data: dict[str, object], env: Mapping[str, str] | None = None) -> Outer:
    return from_mapping(Outer, data, origin="test.toml", env=env or {})


BASE: dict[str, object] = {"name": "o", "ratio": 1, "enabled": True, "inner": {"x": 1}}


def test_generic_loader_maps_every_supported_hint() -> None:
    outer = build(
        {
            **BASE,
            "items": [{"x": 2}, {"x": 3, "label": "${L:-z}"}],
            "tags": ["a", "${T}"],
            "pair": [7, "seven"],
            "limits": {"a": 1, "b": 2},
            "options": {"k": 1},
            "maybe": 5,
            "either": "text",
            "mode": "fast",
            "color": "blue",
            "where": "/srv/${T}",
            "password": "${PW}",
        },
        env={"T": "t", "PW": "pw"},
    )
    assert outer.ratio == 1.0 and isinstance(outer.ratio, float)
    assert outer.inner == Inner(1)
    assert outer.items == (Inner(2), Inner(3, "z"))
    assert outer.tags == ["a", "t"]
    assert outer.pair == (7, "seven")
    assert outer.limits == {"a": 1, "b": 2} and dict(outer.options) == {"k": 1.0}
    assert outer.maybe == 5 and outer.either == "text"
    assert outer.mode == "fast" and outer.color is Color.BLUE
    assert outer.where == Path("/srv/t")
    assert outer.password == Secret("pw") and repr(outer.password) == "***"
    assert build(BASE) == Outer("o", 1.0, True, Inner(1))


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"items": [{"x": 1}, {"x": "2"}]}, "test.toml: items[1].x: expected int, got str"),
        ({"items": [{"x": 1}, {"x": 11}]}, "test.toml: items[1].x: must be at most 10, got 11"),
        ({"items": [{"x": 1}, {"y": 1}]}, "test.toml: items[1].y: unknown key"),
        ({"items": [{"x": 1}, {}]}, "test.toml: items[1].x: missing required key"),
        ({"items": {"x": 1}}, "test.toml: items: expected array, got table"),
        ({"items": [3]}, "test.toml: items[0]: expected table, got int"),
        ({"inner": {"x": -1}}, "test.toml: inner.x: must be at least 0, got -1"),
        ({"tags": ["a", 1]}, "test.toml: tags[1]: expected str, got int"),
        ({"pair": [1]}, "test.toml: pair: expected an array of 2 items, got 1"),
        ({"pair": ["1", "x"]}, "test.toml: pair[0]: expected int, got str"),
        ({"limits": {"a": "x"}}, "test.toml: limits.a: expected int, got str"),
        ({"maybe": "x"}, "test.toml: maybe: expected int, got str"),
        ({"either": 1.5}, "test.toml: either: expected int or str, got float"),
        ({"either": "${NOPE}"}, "test.toml: either: environment variable NOPE is not set"),
        ({"mode": "turbo"}, "test.toml: mode: expected one of 'fast', 'safe', got 'turbo'"),
        ({"mode": "${M}"}, "test.toml: mode: expected one of 'fast', 'safe', got str"),
        ({"color": "green"}, "test.toml: color: expected one of 'red', 'blue', got 'green'"),
        ({"ratio": "1.5"}, "test.toml: ratio: expected float, got str"),
        ({"ratio": False}, "test.toml: ratio: expected float, got bool"),
        ({"enabled": 1}, "test.toml: enabled: expected bool, got int"),
        ({"name": "bad name"}, "test.toml: name: 'bad name' is not a valid name"),
        ({"password": ["x"]}, "test.toml: password: expected str, got array"),
    ],
)
def test_generic_loader_errors(patch: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build({**BASE, **patch}, env={"M": "hidden-value"})
    assert info.value.message == message or info.value.message.startswith(message)
    assert "hidden-value" not in info.value.message


def test_generic_loader_interpolated_scalars() -> None:
    outer = build(
        {**BASE, "ratio": "${R}", "enabled": "${E}", "maybe": "${N}"},
        env={"R": "0.25", "E": "FALSE", "N": " 42 "},
    )
    assert (outer.ratio, outer.enabled, outer.maybe) == (0.25, False, 42)
    with pytest.raises(ConfigError, match="enabled: expected bool, got str"):
        build({**BASE, "enabled": "${E}"}, env={"E": "yes"})


def test_load_toml_with_any_dataclass(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "n"\nratio = 0.5\nenabled = false\n[inner]\nx = 3\n', "o.toml")
    assert load_toml(path, Outer, env={}) == Outer("n", 0.5, False, Inner(3))


def test_check_helpers() -> None:
    check_range(5, "f", min=5, max=5)
    with pytest.raises(ConfigFieldError, match="f: must be at least 6"):
        check_range(5, "f", min=6)
    check_name("shop.orders-1_x", "n")
    with pytest.raises(ConfigFieldError, match="n: must not be empty"):
        check_name("", "n")
    with pytest.raises(ConfigFieldError, match="not a valid name"):
        check_name("-x", "n")


# --- secrets ---------------------------------------------------------------------------


def test_secret_never_prints_its_value(caplog: pytest.LogCaptureFixture) -> None:
    secret = Secret("p4ss")
    assert secret.reveal() == "p4ss"
    assert repr(secret) == str(secret) == f"{secret}" == "%s" % secret == "***"  # noqa: UP031
    assert f"{secret:>5}" == "  ***"
    assert repr([secret]) == "[***]"
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("token %s %r", secret, secret)
    assert "p4ss" not in caplog.text
    assert secret == Secret("p4ss") and secret != Secret("other") and secret != "p4ss"
    assert hash(secret) == hash(Secret("p4ss"))
    assert bool(secret) and not Secret("")
    with pytest.raises(TypeError):
        Secret(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("uri", "redacted"),
    [
        ("mysql://repl:pw@host/db", "mysql://repl:***@host/db"),
        (
            "mysql://repl:s3cr3t@127.0.0.1:3306/?server_id=1001&tables=shop.orders",
            "mysql://repl:***@127.0.0.1:3306/?server_id=1001&tables=shop.orders",
        ),
        ("postgresql+txlog://u:p%40ss@h:5432/db", "postgresql+txlog://u:***@h:5432/db"),
        ("mysql://repl:p@ss/w?rd#x@host:1/", "mysql://repl:***@host:1/"),
        ("mysql://:pw@host/", "mysql://:***@host/"),
        ("mysql://repl@host/db", "mysql://repl@host/db"),
        ("mysql://repl:@host/db", "mysql://repl:@host/db"),
        ("mysql://host:3306/db", "mysql://host:3306/db"),
        ("sqlite:///var/db.sqlite?tables=a.b", "sqlite:///var/db.sqlite?tables=a.b"),
        ("synthetic://?rate=1000", "synthetic://?rate=1000"),
        (
            "relay+http://h:11190/?sources=a.b&token=abc",
            "relay+http://h:11190/?sources=a.b&token=***",
        ),
        ("x://h/?Password=abc&y=1", "x://h/?Password=***&y=1"),
        ("not a uri", "not a uri"),
        ("", ""),
    ],
)
def test_redact_uri(uri: str, redacted: str) -> None:
    assert redact_uri(uri) == redacted


@given(st.text(min_size=1))
def test_repr_of_a_config_never_contains_the_password(password: str) -> None:
    marker = "\x00PW\x00" + password
    config = from_mapping(
        DatabusConfig,
        {
            "relay": {
                "data_dir": "/d",
                "admin_token": "${TOKEN}",
                "buffers": [
                    {"name": "s", "capacity_mb": 1, "source": "mysql://repl:${PW}@h:3306/?x=1"}
                ],
            }
        },
        env={"PW": marker, "TOKEN": marker},
    )
    assert config.relay is not None and config.relay.buffers[0].source.count(marker) == 1
    assert "\x00PW\x00" not in repr(config) and "\\x00PW" not in repr(config)


# --- the bootstrap config --------------------------------------------------------------


def test_example_bootstrap_config_loads_and_hides_the_store_password() -> None:
    example = EXAMPLE.with_name("bootstrap.toml")
    env = {"DATABUS_ADMIN_TOKEN": "adm1n-t0ken", "BOOTSTRAP_DB_PASSWORD": "pg-s3cret-pw"}
    config = load_config(example, env=env).bootstrap
    assert config is not None
    assert config.run == ("producer", "applier", "server")
    assert config.producer.relays == ("http://127.0.0.1:11190",)
    assert config.server.strategy == "auto" and config.retention.hours == 168
    assert "pg-s3cret-pw" in config.storage
    assert "pg-s3cret-pw" not in repr(config)
    assert "pg-s3cret-pw" not in json.dumps(describe(config))


def test_bootstrap_config_errors_name_the_key(tmp_path: Path) -> None:
    base = '[bootstrap]\nstorage = "sqlite:///tmp/b.db"\n'
    assert "producer.relays" in load_error(tmp_path, base)
    assert "bootstrap.storage" in load_error(
        tmp_path, '[bootstrap]\nstorage = "mysql://x"\nrun = ["server"]\n')
    assert "bootstrap.server.strategy" in load_error(
        tmp_path, base + 'run = ["server"]\n[bootstrap.server]\nstrategy = "fastest"\n')
    assert "bootstrap.server.breakeven_ratio" in load_error(
        tmp_path, base + 'run = ["server"]\n[bootstrap.server]\nbreakeven_ratio = 1.5\n')
    assert "bootstrap.run" in load_error(tmp_path, base + 'run = ["indexer"]\n')
