# Thin wrapper over CMake/CTest so the common commands are short. `make help` lists them.
BUILD ?= build
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all test asan fuzz clean help install
all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The build's log goes to a file (printed only if the build fails), so the test summary is what
# a user sees.
test:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) >$(BUILD)/build.log 2>&1 || { cat $(BUILD)/build.log; exit 1; }
	@echo "built $(BUILD)/moh and the tests (log: $(BUILD)/build.log)"
	ctest --test-dir $(BUILD) --output-on-failure

asan:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOH_SANITIZE=ON -DMOH_CUDA=OFF >/dev/null
	@cmake --build build-asan -j $(JOBS) >build-asan/build.log 2>&1 || { cat build-asan/build.log; exit 1; }
	@echo "built build-asan (log: build-asan/build.log)"
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure

# PREFIX/bin/moh, PREFIX/lib/libmoh.a, PREFIX/include/moh.h, PREFIX/share/moh/configs/*.json
install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

# Each fuzz target for FUZZ_SECONDS (default 30) from its seed corpus.
fuzz:
	./tools/fuzz.sh

clean:
	rm -rf $(BUILD) build-asan build-fuzz

help:
	@echo "make          build moh (Release, $(BUILD)/moh)"
	@echo "make test     build and run the test suite (CTest)"
	@echo "make asan     the same tests under AddressSanitizer + UBSan"
	@echo "make install  install moh, libmoh.a, moh.h and the configs under PREFIX (default /usr/local)"
	@echo "make fuzz     run every fuzz target for FUZZ_SECONDS (needs clang)"
	@echo "make interop  LM and ViT checkpoints against transformers, timm and the PyTorch references,"
	@echo "              and SmolLM2 against transformers (PYTHON=path/to/venv/bin/python), and interop-llamacpp"
	@echo "make interop-llamacpp  SmolLM2 GGUF -> moh -> GGUF F32 in llama.cpp: tokens, logits, greedy"

# The decoder LM and the ViT against PyTorch through the CLI: moh train/eval checkpoints, logits and
# first-step gradients compared with transformers / timm (dense) and tools/ref/lm_ref.py,
# vit_ref.py (MoH); then SmolLM2 (models/, tools/data/fetch_smollm2.sh) against transformers
# loading the same GGUF: tokens, logits <= 1e-4, 64 greedy tokens (make interop-smollm2 alone), and
# the round trip through llama.cpp (interop-llamacpp). Needs PYTHON (default python3) with torch,
# safetensors, transformers, timm, and for SmolLM2 gguf, numpy, accelerate and llama-cpp-python.
PYTHON ?= python3
SMOLLM2 ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
.PHONY: interop interop-smollm2 interop-llamacpp
interop: all interop-llamacpp
	$(PYTHON) tools/ref/interop_lm.py --moh $(BUILD)/moh
	$(PYTHON) tools/ref/interop_vit.py --moh $(BUILD)/moh
	$(PYTHON) tools/ref/interop_smollm2.py --moh $(BUILD)/moh

interop-smollm2: all
	$(PYTHON) tools/ref/interop_smollm2.py --moh $(BUILD)/moh

# SmolLM2 round trip in llama.cpp (tools/ref/roundtrip_llamacpp.py): the GGUF (Q4_1) -> moh -> GGUF
# (F32, with its tokenizer); llama.cpp tokenizes the export as the original, its logits on the
# export equal moh's on the original (<= 1e-4 relative), greedy continuations identical.
interop-llamacpp: all
	$(PYTHON) tools/ref/roundtrip_llamacpp.py --moh $(BUILD)/moh --model $(SMOLLM2)
