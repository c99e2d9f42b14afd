# The README's two commands: `make test` and (with the client issue) `make demo`.
# Both start from nothing on a fresh Debian machine: they install the Debian packages
# the suite needs when missing, create .venv and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEB_PACKAGES := mariadb-server postgresql zookeeper openjdk-17-jre-headless \
	libpostgresql-jdbc-java libmariadb-java gcc zlib1g-dev
# The import packages, mapped from top-level folders (pyproject's package-dir).
SUBPACKAGES := relay bootstrap client fetchers spark_jobs replicator

.PHONY: test demo deps apt venv lint typecheck unit integration bench bench-deps clean

# The unit suite runs a second time on the pure-Python event core (databus.batch): both
# twins pass the same tests.
test: deps venv lint typecheck
	$(BIN)/pytest
	DATABUS_PURE_PYTHON=1 $(BIN)/pytest tests/unit -q

# The whole pipeline on embedded defaults (SQLite source with triggers, a relay, a
# consumer keeping a replica), with a live status view; ends with the replica check.
demo: venv
	$(BIN)/databus demo

unit: venv
	$(BIN)/pytest tests/unit

integration: deps venv
	$(BIN)/pytest tests/integration

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
$(BIN)/.installed: pyproject.toml setup.py databus/batch/_native.pyx databus/batch/_wire.h \
		fetchers/postgres/_transcode_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark,fast]'
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

# The benchmarks' optional extras (matplotlib for the plots).
bench-deps: $(BIN)/.bench-installed

$(BIN)/.bench-installed: $(BIN)/.installed
	@$(MAKE) --no-print-directory apt PACKAGES="redis-server"
	$(BIN)/pip install -q -e '.[dev,spark,fast,bench]'
	touch $@

bench: venv bench-deps
	$(BIN)/python benchmarks/codec.py

clean:
	rm -rf .typecheck .mypy_cache .pytest_cache .ruff_cache
