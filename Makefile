# The README's two commands: `make test` and (with the client issue) `make demo`.
# Both start from nothing on a fresh Debian machine: they install the Debian packages
# the suite needs when missing, create .venv and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEB_PACKAGES := mariadb-server postgresql zookeeper openjdk-17-jre-headless \
	libpostgresql-jdbc-java libmariadb-java gcc zlib1g-dev libmariadb-dev pkg-config \
	chromium prometheus systemd strace
# The import packages, mapped from top-level folders (pyproject's package-dir).
SUBPACKAGES := relay bootstrap client fetchers spark_jobs replicator

.PHONY: test test-full demo deps apt venv lint typecheck unit integration twins bench \
	bench-deps clean

# Two workers (the machines have two cores); tests that must not run beside each other
# share a pytest.mark.xdist_group (docs/testing.md, "Tiers and workers").
XDIST := -n 2 --dist loadgroup

# `make test` (what CI runs): every behaviour, the acceptance runs at their smoke size
# (tests/tiers.py). Unit tests first, so that a broken build fails in a minute; then the
# servers' tests; then the tests marked `twin` again on the pure-Python twins of the
# compiled modules (DATABUS_PURE_PYTHON=1), which must pass the same tests.
test: deps venv lint typecheck
	$(BIN)/pytest tests/unit $(XDIST)
	$(BIN)/pytest tests/integration $(XDIST)
	$(MAKE) --no-print-directory twins

twins: venv
	DATABUS_PURE_PYTHON=1 $(BIN)/pytest -m twin $(XDIST) -q

# `make test-full`: the acceptance runs at their issues' sizes (DATABUS_TEST_TIER=full;
# each test's own knob still overrides), and the whole unit suite on the pure-Python twins.
test-full: deps venv lint typecheck
	DATABUS_TEST_TIER=full $(BIN)/pytest $(XDIST)
	DATABUS_TEST_TIER=full DATABUS_PURE_PYTHON=1 $(BIN)/pytest tests/unit $(XDIST) -q

# The whole pipeline on embedded defaults (SQLite source with triggers, a relay, a
# consumer keeping a replica), with a live status view; ends with the replica check.
demo: venv
	$(BIN)/databus demo

unit: venv
	$(BIN)/pytest tests/unit $(XDIST)

integration: deps venv
	$(BIN)/pytest tests/integration $(XDIST)

deps:
	@$(MAKE) --no-print-directory apt PACKAGES="$(DEB_PACKAGES)"

apt:
	@missing=""; \
	for p in $(PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

venv: $(BIN)/.installed

# The compiled event core is built by the install (setup.py); its sources rebuild it.
$(BIN)/.installed: pyproject.toml setup.py databus/batch/_native.pyx databus/batch/_check.pxi databus/batch/_windows.pxi databus/batch/_wire.h \
		fetchers/postgres/_transcode_native.pyx fetchers/mysql/_rows_native.pyx \
		replicator/_avrorow_native.pyx replicator/targets/_pgcopy_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark,fast]'
	@# The dump's C driver (mysqlclient) builds against libmariadb-dev, which `make deps`
	@# installs; without it (`make demo` on a bare machine) dumps read with pymysql.
	@$(BIN)/pip install -q 'mysqlclient>=2.2' 2>/dev/null || echo "WARNING: databus: \
	mysqlclient was not built (run make deps for libmariadb-dev); dumps read with pymysql"
	touch $@

lint: venv
	$(BIN)/ruff check .

# mypy cannot follow setuptools' package-dir mapping, so it checks a tree of links
# that has the installed shape: .typecheck/databus/{core modules, relay, client, ...}.
typecheck: venv
	@rm -rf .typecheck && mkdir -p .typecheck/databus
	@for f in databus/*; do ln -s "../../$$f" .typecheck/databus/; done
	@for p in $(SUBPACKAGES); do ln -s "../../$$p" ".typecheck/databus/$$p"; done
	$(BIN)/mypy -p databus

# The benchmarks' optional extras (matplotlib for the plots; redis-server for the Redis
# peer; mydumper, the reference of benchmarks/dump.py).
# The Debian packages are checked on every run (cheap), so that a venv installed before
# one was added to the list still gets it.
bench-deps: $(BIN)/.bench-installed
	@$(MAKE) --no-print-directory apt PACKAGES="redis-server mydumper"

$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[dev,spark,fast,bench]'
	touch $@

bench: venv bench-deps
	$(BIN)/python benchmarks/codec.py

clean:
	rm -rf .typecheck .mypy_cache .pytest_cache .ruff_cache
