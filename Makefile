# The two commands of the README:
#   make demo   trains the cnn at opt level O2 on Fashion-MNIST for 3 epochs, prints its results
#               and writes its metrics to $(BUILD)/demo-metrics.jsonl
#   make test   builds everything and runs the test suite
# Both install missing Debian packages first (scripts/deps.sh: demo, build and
# install only what building needs; test also what the suite runs).
# And for using ampc as a library:
#   make install [PREFIX=/usr/local] [DESTDIR=]   libampc (shared and static), headers, ampc,
#                                                 man pages, pkg-config file, CMake package
#   make uninstall                                removes what the last install put
#   make docs                                     the API reference (Doxygen) in build/docs/api/html

BUILD ?= build
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all deps deps-build deps-docs build test demo install uninstall docs clean

all: build

deps:
	@bash scripts/deps.sh test
deps-build:
	@bash scripts/deps.sh build
deps-docs:
	@bash scripts/deps.sh docs

build: deps-build
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# the suite's packages before the build's configure step, which looks for
# some of them (SIMDe for test_avx512_emu)
test: deps build
	@cd $(BUILD) && ctest --output-on-failure -j 2

demo: build
	$(BUILD)/ampc train --model cnn --dataset fashion-mnist --epochs 3 --opt-level O2 --metrics $(BUILD)/demo-metrics.jsonl

# the prefix is set at configure time too, so the library folder follows
# the platform's rule for it (lib/<multiarch> under /usr)
install: build
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX="$(PREFIX)" >/dev/null
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD)

# (and then the folders of ampc's own it made, deepest first, where empty:
# include/ampc, lib/cmake/ampc, share/doc/ampc/...; never a shared one)
uninstall:
	@if [ -f $(BUILD)/install_manifest.txt ]; then \
	  sed 's|^|$(DESTDIR)|' $(BUILD)/install_manifest.txt | xargs -d '\n' rm -fv; \
	  sed 's|^|$(DESTDIR)|' $(BUILD)/install_manifest.txt | xargs -r -d '\n' -n 1 dirname | grep '/ampc\(/\|$$\)' | sort -ru | \
	    xargs -r -d '\n' rmdir -v --ignore-fail-on-non-empty; \
	fi

docs: deps-docs build
	@cmake --build $(BUILD) --target docs

clean:
	rm -rf $(BUILD)
