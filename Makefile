# The two commands a newcomer needs (README.md): `make serve` and `make test`.
# Both install missing Debian packages first (scripts/install-deps.sh), then build.
PRESET ?= release
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)
HOST   ?= 127.0.0.1
PORT   ?= 8000
MODEL  ?= models/demo
# CI builds with warnings as errors, so a warning never lands.
ifeq ($(CI),true)
CMAKE_ARGS += -DLMSERVE_WERROR=ON
endif

.PHONY: serve test build deps clean
.DEFAULT_GOAL := help

help:
	@echo "make serve   install dependencies, build ($(PRESET)), serve $(MODEL) on http://$(HOST):$(PORT)"
	@echo "make test    install dependencies, build, run every test"
	@echo "make build   build only (PRESET=release|debug|asan)"

deps:
	@scripts/install-deps.sh

build: deps
	@mkdir -p build && cmake --preset $(PRESET) $(CMAKE_ARGS) > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }
	@cmake --build --preset $(PRESET) -j $(JOBS)

serve: build
	@scripts/serve-demo.sh $(BUILD)/lmserve $(MODEL) $(HOST) $(PORT)

test: build
	@scripts/run-tests.sh $(PRESET)

clean:
	rm -rf build
