"""The did-you-mean of an unknown source name, pure (issue 28 item 6; relay/_catalog.py
``did_you_mean``, used in the relay's ``unknown_source`` message)."""

from __future__ import annotations

from databus.relay._catalog import did_you_mean

KNOWN = ["sakila.actor", "sakila.film", "sakila.film_actor", "shop.orders"]


def test_a_typo_gets_the_closest_name() -> None:
    assert did_you_mean("sakila.actors", KNOWN).startswith(" (did you mean sakila.actor")
    assert did_you_mean("sakla.actor", KNOWN).startswith(" (did you mean sakila.actor")
    assert did_you_mean("shop.order", KNOWN) == " (did you mean shop.orders?)"


def test_case_is_ignored_but_kept_in_the_answer() -> None:
    assert did_you_mean("Shop.Orders", KNOWN) == " (did you mean shop.orders?)"


def test_nothing_close_gives_nothing_and_never_the_name_itself() -> None:
    assert did_you_mean("inventory.stock", KNOWN) == ""
    assert did_you_mean("x.y", []) == ""
    assert "sakila.film?" not in did_you_mean("sakila.film", KNOWN)


def test_several_close_names_are_joined_with_or() -> None:
    hint = did_you_mean("sakila.filmx", ["sakila.film", "sakila.films"])
    assert hint in (" (did you mean sakila.film or sakila.films?)",
                    " (did you mean sakila.films or sakila.film?)")
