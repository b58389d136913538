# fleet: the two commands users need are `make demo` and `make test`.
BUILD_DIR ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo clean format fuzz sanitize soak bench bench-python bench-flood bench-gridsearch test-kubernetes

all: build

deps:
	@bash scripts/deps.sh

$(BUILD_DIR)/build.ninja: | deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS) >/dev/null

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The container images build in the background meanwhile (downloads overlap
# the compile); the docker tests' fixture waits for that build.
test: deps
	@bash docker/build-images.sh --background $(abspath $(BUILD_DIR))/docker-images.log
	@$(MAKE) --no-print-directory build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)/bin

# libFuzzer targets of every decoder (clang, ASan+UBSan), FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh

# ASan+UBSan over every non-Docker test, TSan over the threaded ones
# (scripts/sanitize.sh; MODES=asan or MODES=tsan runs one of them).
sanitize: deps
	@JOBS=$(JOBS) bash scripts/sanitize.sh $(MODES)

# The long mixed fault run: worker, broker and autoscaler kills, SIGSTOP,
# scale churn under load, then the ledger of every batch (tests/soak).
SOAK_MINUTES ?= 30
soak: build
	@$(BUILD_DIR)/tests/fleet-soak --minutes $(SOAK_MINUTES)

# Benchmarks (bench/run.py): fleet next to the ZeroMQ ceiling, Celery and
# Dask; one table, bench/results/latest.json and PNGs. About 5 minutes on
# 2 cores; BENCH=--quick for a few minutes.
BENCH ?=
bench: build
	@/usr/bin/python3 bench/run.py --bin $(abspath $(BUILD_DIR))/bin $(BENCH)

# Only the Python part of make bench (bench/python_bench.py): the seed's
# joblib case against loky and Dask, and a Python function against Celery.
# About 40 s.
bench-python: build
	@/usr/bin/python3 bench/python_bench.py --bin $(abspath $(BUILD_DIR))/bin $(BENCH)

# A flood of connections that each start a maximum-size frame and never
# finish it (bench/flood_bench.py): the broker's peak RSS with the inbound
# budget, without it and with the old frame limit, and a producer's
# throughput alone and during the flood. About a minute; needs ~2 GB free.
bench-flood: build
	@/usr/bin/python3 bench/flood_bench.py --bin $(abspath $(BUILD_DIR))/bin $(BENCH)

# The seed's example measured (bench/gridsearch_bench.py): GridSearchCV's 20
# fits over a 40 MB X sequentially, with loky, Dask (when installed) and a
# fleet warm and from zero workers, with the bytes that crossed the broker.
# About 3 minutes on 2 cores.
bench-gridsearch: build
	@/usr/bin/python3 bench/gridsearch_bench.py --bin $(abspath $(BUILD_DIR))/bin $(BENCH)

# The Kubernetes launcher against a real kube-apiserver and etcd, built from
# the Go module proxy by scripts/kube-apiserver.sh into FLEET_KUBE_CACHE
# (default ~/.cache/fleet-kube): about 5-10 minutes and 2 GB the first time
# (Go 1.24+ needed), cached after. The test itself takes about 30 s
# (tests/kubernetes/kube_test.py). Not part of make test.
test-kubernetes: build
	@/usr/bin/python3 tests/kubernetes/kube_test.py --bin-dir $(abspath $(BUILD_DIR))/bin \
	  --kube-bin "$$(bash scripts/kube-apiserver.sh)" --source-dir $(CURDIR)

clean:
	rm -rf $(BUILD_DIR)
