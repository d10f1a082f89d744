# The commands people type. CMake + Ninja do the work; see README.md.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build run test clean format

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Until the server lands, the main job is a greedy generation on the embedded model.
run: build
	$(BUILD_DIR)/peregrine generate --prompt "Once upon a time" --max-tokens 120 --temperature 0

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD_DIR)
