"""A database shaped like MySQL's Sakila sample, and a writer changing it.

Written for these tests after the shape of Sakila: the same kinds of keys, types
(unsigned integers, YEAR, DECIMAL, ENUM, SET, TEXT, BLOB, GEOMETRY, BOOLEAN, DATETIME,
TIMESTAMP), constraints, triggers and views, not its data. Used by the dump acceptance
test and the replicator's.
"""

from __future__ import annotations

import threading
import time

from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import Sql

SAKILA_SCHEMA = [
    "CREATE TABLE language (language_id TINYINT UNSIGNED NOT NULL AUTO_INCREMENT, "
    "name CHAR(20) NOT NULL, last_update TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP "
    "ON UPDATE CURRENT_TIMESTAMP, PRIMARY KEY (language_id))",
    "CREATE TABLE actor (actor_id SMALLINT UNSIGNED NOT NULL AUTO_INCREMENT, "
    "first_name VARCHAR(45) NOT NULL, last_name VARCHAR(45) NOT NULL, "
    "last_update TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, "
    "PRIMARY KEY (actor_id), KEY idx_actor_last_name (last_name))",
    "CREATE TABLE film (film_id SMALLINT UNSIGNED NOT NULL AUTO_INCREMENT, "
    "title VARCHAR(128) NOT NULL, description TEXT, release_year YEAR, "
    "language_id TINYINT UNSIGNED NOT NULL, rental_duration TINYINT UNSIGNED NOT NULL "
    "DEFAULT 3, rental_rate DECIMAL(4,2) NOT NULL DEFAULT 4.99, length SMALLINT UNSIGNED, "
    "replacement_cost DECIMAL(5,2) NOT NULL DEFAULT 19.99, "
    "rating ENUM('G','PG','PG-13','R','NC-17') DEFAULT 'G', special_features "
    "SET('Trailers','Commentaries','Deleted Scenes','Behind the Scenes'), "
    "last_update TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, "
    "PRIMARY KEY (film_id), KEY idx_title (title), CONSTRAINT fk_film_language FOREIGN KEY "
    "(language_id) REFERENCES language (language_id) ON DELETE RESTRICT ON UPDATE CASCADE)",
    "CREATE TABLE film_actor (actor_id SMALLINT UNSIGNED NOT NULL, film_id SMALLINT "
    "UNSIGNED NOT NULL, last_update TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE "
    "CURRENT_TIMESTAMP, PRIMARY KEY (actor_id, film_id), KEY idx_fk_film_id (film_id), "
    "CONSTRAINT fk_film_actor_actor FOREIGN KEY (actor_id) REFERENCES actor (actor_id), "
    "CONSTRAINT fk_film_actor_film FOREIGN KEY (film_id) REFERENCES film (film_id))",
    "CREATE TABLE film_text (film_id SMALLINT NOT NULL, title VARCHAR(255) NOT NULL, "
    "description TEXT, PRIMARY KEY (film_id), FULLTEXT KEY idx_title_description "
    "(title, description))",
    "CREATE TABLE address (address_id SMALLINT UNSIGNED NOT NULL AUTO_INCREMENT, "
    "address VARCHAR(50) NOT NULL, district VARCHAR(20) NOT NULL, postal_code VARCHAR(10), "
    "phone VARCHAR(20) NOT NULL, location GEOMETRY NOT NULL, last_update TIMESTAMP NOT NULL "
    "DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, PRIMARY KEY (address_id), "
    "SPATIAL KEY idx_location (location))",
    "CREATE TABLE staff (staff_id TINYINT UNSIGNED NOT NULL AUTO_INCREMENT, "
    "first_name VARCHAR(45) NOT NULL, address_id SMALLINT UNSIGNED NOT NULL, picture BLOB, "
    "email VARCHAR(50), active BOOLEAN NOT NULL DEFAULT TRUE, username VARCHAR(16) NOT NULL, "
    "password VARCHAR(40) BINARY, last_update TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP "
    "ON UPDATE CURRENT_TIMESTAMP, PRIMARY KEY (staff_id), CONSTRAINT fk_staff_address "
    "FOREIGN KEY (address_id) REFERENCES address (address_id))",
    "CREATE TABLE payment (payment_id SMALLINT UNSIGNED NOT NULL AUTO_INCREMENT, "
    "staff_id TINYINT UNSIGNED NOT NULL, amount DECIMAL(5,2) NOT NULL, payment_date "
    "DATETIME NOT NULL, last_update TIMESTAMP NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE "
    "CURRENT_TIMESTAMP, PRIMARY KEY (payment_id), CONSTRAINT fk_payment_staff FOREIGN KEY "
    "(staff_id) REFERENCES staff (staff_id))",
    "CREATE TRIGGER ins_film AFTER INSERT ON film FOR EACH ROW INSERT INTO film_text "
    "(film_id, title, description) VALUES (new.film_id, new.title, new.description)",
    "CREATE TRIGGER upd_film AFTER UPDATE ON film FOR EACH ROW UPDATE film_text SET "
    "title = new.title, description = new.description WHERE film_id = old.film_id",
    "CREATE TRIGGER del_film AFTER DELETE ON film FOR EACH ROW DELETE FROM film_text "
    "WHERE film_id = old.film_id",
    "CREATE VIEW actor_info AS SELECT a.actor_id, a.first_name, COUNT(fa.film_id) AS films "
    "FROM actor a LEFT JOIN film_actor fa ON fa.actor_id = a.actor_id GROUP BY a.actor_id",
]
SAKILA_TABLES = ["language", "actor", "film", "film_actor", "film_text", "address", "staff",
                 "payment"]
FEATURES = ["Trailers", "Commentaries", "Deleted Scenes", "Behind the Scenes"]
RATINGS = ["G", "PG", "PG-13", "R", "NC-17"]


def load_sakila_shape(sql: Sql, films: int = 400) -> None:
    """The schema, then its rows."""
    sql.run(*SAKILA_SCHEMA)
    load_sakila_rows(sql, films)


def load_sakila_rows(sql: Sql, films: int = 400) -> None:
    """The sample's rows, a statement per table (a transaction each: autocommit)."""
    sql.run("INSERT INTO language (name) VALUES ('English'), ('Italian'), ('Japanese'), "
            "('Mandarin'), ('French'), ('German')")
    sql.run("INSERT INTO actor (first_name, last_name) VALUES " + ", ".join(
        f"('FIRST{i}', 'LAST{i % 37}')" for i in range(200)))
    sql.run("INSERT INTO film (title, description, release_year, language_id, "
            "rental_duration, rental_rate, length, replacement_cost, rating, "
            "special_features) VALUES " + ", ".join(
                f"('FILM {i}', '{'A story of ' * (i % 7 + 1)}number {i}', {1990 + i % 30}, "
                f"{1 + i % 6}, {3 + i % 5}, {(i % 5) + 0.99}, {60 + i % 120}, "
                f"{10 + i % 20}.99, '{RATINGS[i % 5]}', "
                f"'{','.join(f for j, f in enumerate(FEATURES) if i >> j & 1)}')"
                for i in range(films)))
    sql.run("INSERT INTO film_actor (actor_id, film_id) VALUES " + ", ".join(
        f"({1 + (f * 7 + k * 13) % 200}, {f + 1})" for f in range(films) for k in range(4)))
    sql.run("INSERT INTO address (address, district, postal_code, phone, location) VALUES "
            + ", ".join(f"('{i} Main St', 'D{i % 9}', {'NULL' if i % 4 == 0 else f'{i:05d}'}"
                        f", '555{i:04d}', ST_GeomFromText('POINT({i % 90} {-i % 180})'))"
                        for i in range(150)))
    sql.run("INSERT INTO staff (first_name, address_id, picture, email, username, password) "
            "VALUES ('Mike', 1, x'89504e470d0a1a0a00ff', 'mike@example.org', 'mike', "
            "'8cb2237d0679ca88db6464eac60da96345513964'), ('Jon', 2, NULL, NULL, 'jon', NULL)")
    sql.run("INSERT INTO payment (staff_id, amount, payment_date) VALUES " + ", ".join(
        f"({1 + i % 2}, {i % 12}.{i % 100:02d}, '2005-05-{1 + i % 28:02d} "
        f"{i % 24:02d}:{i % 60:02d}:00')" for i in range(1500)))


class FilmWriter(threading.Thread):
    """Updates, inserts and deletes of films (their triggers change film_text in the same
    transaction) and payments until stopped."""

    def __init__(self, server: MariaDBServer, db: str) -> None:
        super().__init__(daemon=True)
        self.sql = Sql(server, db)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                film = 1 + (n * 37) % 400
                kind = n % 4
                if kind == 0:
                    self.sql.txn(f"UPDATE film SET description = 'changed {n}', rating = "
                                 f"'{RATINGS[n % 5]}', special_features = 'Trailers' "
                                 f"WHERE film_id = {film}")
                elif kind == 1:
                    self.sql.txn(f"DELETE FROM film_actor WHERE film_id = {film}",
                                 f"DELETE FROM film WHERE film_id = {film}")
                elif kind == 2:
                    self.sql.txn("INSERT INTO film (title, language_id, special_features) "
                                 f"VALUES ('NEW {n}', 1, 'Commentaries,Behind the Scenes')")
                else:
                    self.sql.txn(f"UPDATE payment SET amount = amount + 1 WHERE payment_id = "
                                 f"{1 + n % 1500}")
                self.transactions += 1
                time.sleep(0.002)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert self.error is None, self.error
        self.sql.close()


