# The two commands of the README:
#   make demo   trains the default model (cnn, O2) on Fashion-MNIST and prints its results
#   make test   builds everything and runs the test suite
# Both install missing Debian packages first (scripts/deps.sh).

BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps build test demo clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j 2

demo: build
	$(BUILD)/ampc train --model cnn --dataset fashion-mnist --epochs 3 --opt-level O2 --metrics $(BUILD)/demo-metrics.jsonl

clean:
	rm -rf $(BUILD)
