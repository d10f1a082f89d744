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

# The main job: serve the embedded model's OpenAI API on 127.0.0.1:8000 (prints a curl example
# once ready; Ctrl-C stops it).
run: build
	$(BUILD_DIR)/peregrine serve --host 127.0.0.1 --port 8000

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD_DIR)
