# sqdisc: build, install and check the C library. `make help` lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:

CARGO ?= cargo
ifeq ($(origin CXX),default)
CXX := c++
endif
NM ?= nm
OBJCOPY ?= objcopy
LD_R ?= ld
AR := ar

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DESTDIR ?=

# The version is written once, in Cargo.toml's [package] section.
VERSION := $(shell awk -F'"' '/^\[/ { pkg = ($$0 == "[package]") } pkg && /^version *=/ { print $$2; exit }' Cargo.toml)
MAJOR := $(word 1,$(subst ., ,$(VERSION)))
ifeq ($(VERSION),)
$(error cannot read the package version from Cargo.toml)
endif

BUILD := build
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
RELEASE_DIR := $(TARGET_DIR)/release

LIB_SO := libsqdisc.so
LIB_SONAME := $(LIB_SO).$(MAJOR)
LIB_REAL := $(LIB_SO).$(VERSION)
LIB_A := libsqdisc.a

# libsqdisc_sim, the software HCA's C library (sim/, the crate sqdisc-sim; sim/src/capi/sim.rs): versioned on its
# own, in sim/Cargo.toml.
SIM_VERSION := $(shell awk -F'"' '/^\[/ { pkg = ($$0 == "[package]") } pkg && /^version *=/ { print $$2; exit }' sim/Cargo.toml)
SIM_MAJOR := $(word 1,$(subst ., ,$(SIM_VERSION)))
SIM_SO := libsqdisc_sim.so
SIM_SONAME := $(SIM_SO).$(SIM_MAJOR)
SIM_REAL := $(SIM_SO).$(SIM_VERSION)
SIM_A := libsqdisc_sim.a
# libsqdisc_scripted, the scripted test device's C library (sim/src/scripted, sim/src/capi/scripted.rs): for this
# repository's C tests only, never installed; its header is c-tests/support/sqdisc_scripted.h.
SCRIPTED_LIBDIR := $(BUILD)/test/lib

# The staging install that the C tests and examples build against, as a user's system would have it.
STAGE := $(CURDIR)/$(BUILD)/stage
STAGE_PREFIX := /usr
STAGE_LIBDIR := $(STAGE_PREFIX)/lib
STAGE_VARS := DESTDIR=$(STAGE) PREFIX=$(STAGE_PREFIX) BINDIR=$(STAGE_PREFIX)/bin LIBDIR=$(STAGE_LIBDIR) \
	INCLUDEDIR=$(STAGE_PREFIX)/include PKGCONFIGDIR=$(STAGE_LIBDIR)/pkgconfig
STAGE_PKG_CONFIG := PKG_CONFIG_SYSROOT_DIR=$(STAGE) PKG_CONFIG_PATH=$(STAGE)$(STAGE_LIBDIR)/pkgconfig \
	PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config
C_STRICT := -std=c11 -Wall -Wextra -Wpedantic -Werror

# libsqdisc_spdk, the SPDK RDMA provider (spdk/): versioned on its own, in spdk/Cargo.toml.
SPDK_VERSION := $(shell awk -F'"' '/^\[/ { pkg = ($$0 == "[package]") } pkg && /^version *=/ { print $$2; exit }' spdk/Cargo.toml)
SPDK_MAJOR := $(word 1,$(subst ., ,$(SPDK_VERSION)))
SPDK_SO := libsqdisc_spdk.so
SPDK_SONAME := $(SPDK_SO).$(SPDK_MAJOR)
SPDK_REAL := $(SPDK_SO).$(SPDK_VERSION)
SPDK_A := libsqdisc_spdk.a

# libsqdisc_check, the discipline checker for unmodified verbs programs (check/): versioned on its own.
CHECK_VERSION := $(shell awk -F'"' '/^\[/ { pkg = ($$0 == "[package]") } pkg && /^version *=/ { print $$2; exit }' check/Cargo.toml)
CHECK_MAJOR := $(word 1,$(subst ., ,$(CHECK_VERSION)))
CHECK_SO := libsqdisc_check.so
CHECK_SONAME := $(CHECK_SO).$(CHECK_MAJOR)
CHECK_REAL := $(CHECK_SO).$(CHECK_VERSION)

# The device daemon and its preload library (simdev/, docs/sim.md "Running unmodified programs"): a program
# and a library that is only ever preloaded, so no soname, no archive, no .pc file. `sqdisc-sim run` finds the
# preload beside itself or in ../lib, so the build tree has the install tree's shape: bin/ and lib/.
SIMDEV_BIN := sqdisc-sim
SIMDEV_PRELOAD := libsqdisc_sim_preload.so

.PHONY: all help deps deps-build simdev simdev-cargo-release sim-matrix sim-device-tests bench-sim sim-lib sim-cargo-release scripted-lib check-sim-symbols spdk-shim spdk-cargo-release check-spdk-symbols check-lib check-cargo-release check-check-symbols check-checker check-spdk-dropin test header check-headers check-rlib-symbols check-symbols check-installed-symbols stage c-tests \
	check-install check demo install uninstall clean cargo-release

help:
	@echo 'make            build the release libraries and sqdisc.pc into $(BUILD)/'
	@echo 'make check      everything CI runs: deps, cargo test (bounded fault campaign), miri, tsan, header/ABI'
	@echo '                checks, unmodified programs on the device daemon (sim-matrix), C tests (ASan+UBSan, valgrind), SPDK drop-in, the checker'"'"'s tests, fuzz-smoke, bench-guard,'
	@echo '                install round trip'
	@echo 'make demo       build examples/demo.c against a staged install and run it'
	@echo 'make sim-lib    build libsqdisc_sim (the software HCA'"'"'s C library, docs/sim.md) and sqdisc_sim.pc'
	@echo 'make spdk-shim  build libsqdisc_spdk (the SPDK RDMA provider, docs/spdk.md) and sqdisc_spdk.pc'
	@echo 'make check-lib  build libsqdisc_check (the discipline checker, docs/check.md) and sqdisc_check.pc'
	@echo 'make simdev     build $(BUILD)/bin/sqdisc-sim (the device daemon) and $(BUILD)/lib/libsqdisc_sim_preload.so'
	@echo '                (unmodified verbs programs on the software HCA, docs/sim.md); part of make'
	@echo 'make sim-matrix unmodified ibv_*_pingpong, perftest, rping, ucmatose, rdma_server/client and qperf binaries'
	@echo '                on the device, plain, under loss and under the checker (scripts/sim-matrix.sh; after'
	@echo '                make stage), run by make check'
	@echo 'make sim-device-tests  the device daemon'"'"'s faults: a client killed mid-transfer, the daemon killed, a second'
	@echo '                daemon, another user, a reused SEND source (scripts/sim-device-tests.sh; after make stage), in check'
	@echo 'make bench-check  the checker'"'"'s instructions per WR on the null provider (docs/check.md)'
	@echo 'make check-checker  the checker'"'"'s C tests and the demo comparison on the software HCA (after make stage)'
	@echo 'make bench-spdk the SPDK provider'"'"'s instructions per WR against the verbs provider'"'"'s (docs/spdk.md)'
	@echo 'make simdev-tests C programs on the sim device through sqdisc-sim (c-tests/simdev), run by make check'
	@echo 'make e2e-spdk   SPDK_SRC=<SPDK release tree, its DPDK in dpdk/>: real SPDK over the sim device (docs/spdk.md); not in check'
	@echo 'make bench      instruction counts against raw verbs on a null provider and the software HCA (docs/PERFORMANCE.md)'
	@echo '                then make bench-sim'
	@echo 'make bench-sim  64-byte SENDs between two processes through the device daemon, against the in-process sim'
	@echo '                (wall clock, docs/perf/sim-device.txt)'
	@echo 'make bench-guard  the untimed regression guard that make check runs'
	@echo 'make soak       the target-scale tests scaled up (SQDISC_SOAK=1), then a long fault campaign'
	@echo 'make fuzz       fuzz the C API for FUZZ_SECONDS (default 600) with cargo-fuzz and ASan; fuzz-smoke: ~30 s, in check'
	@echo 'make miri       the unsafe-code tests under Miri (nightly; scripts/miri.sh), run by make check'
	@echo 'make tsan       the thread-safe mode under ThreadSanitizer (nightly; scripts/tsan.sh), run by make check'
	@echo 'make header     regenerate include/*.h from the Rust sources (commit the result)'
	@echo 'make install    PREFIX=$(PREFIX) BINDIR=$(BINDIR) LIBDIR=$(LIBDIR) INCLUDEDIR=$(INCLUDEDIR) PKGCONFIGDIR=$(PKGCONFIGDIR) DESTDIR='
	@echo 'make uninstall  remove what install put there (same variables)'
	@echo 'make deps       install what the build and every check need (Debian packages as root, nightly tools)'
	@echo 'make clean      remove $(BUILD)/ and cargo'"'"'s target directory'

all: $(BUILD)/lib/$(LIB_REAL) $(BUILD)/lib/$(LIB_A) $(BUILD)/sqdisc.pc sim-lib scripted-lib spdk-shim check-lib simdev

deps:
	bash scripts/install-deps.sh check

# What building the libraries and the demo needs, and nothing more: a newcomer's `make demo` waits for no
# fuzzer, Miri or sanitizer toolchain.
deps-build:
	bash scripts/install-deps.sh build

# ---- release build ---------------------------------------------------------------------------------------

# $(call native_static_libs,LOG,OUT,DROP): the native libraries of rustc's `native-static-libs` note in
# $(BUILD)/LOG (cargo replays it when nothing was rebuilt), less the -l options in DROP (those the .pc file
# requires), written to $(BUILD)/OUT only when they changed, so that nothing depending on OUT is redone.
define native_static_libs
	@libs=$$(sed -n 's/^note: native-static-libs: //p' $(BUILD)/$(1) | tail -n 1); \
	if [ -z "$$libs" ]; then echo "error: rustc printed no native-static-libs line" >&2; exit 1; fi; \
	libs=$$(printf '%s\n' $$libs | grep -vx $(foreach l,$(3),-e '$(l)') | tr '\n' ' ' | sed 's/ *$$//'); \
	printf '%s\n' "$$libs" > $(BUILD)/$(2).new; \
	cmp -s $(BUILD)/$(2).new $(BUILD)/$(2) 2>/dev/null \
		&& rm $(BUILD)/$(2).new || mv $(BUILD)/$(2).new $(BUILD)/$(2)
endef

# $(call pkgconfig_file,VERSION[,LIBS]): the .pc file $@ from its template $<, with the install directories,
# VERSION and, given LIBS (a file in $(BUILD) that native_static_libs wrote), Libs.private.
define pkgconfig_file
	@mkdir -p $(@D)
	sed -e 's|@PREFIX@|$(PREFIX)|' \
	    -e 's|@LIBDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))|' \
	    -e 's|@VERSION@|$(1)|' \
	    $(if $(2),-e "s|@LIBS_PRIVATE@|$$(cat $(BUILD)/$(2))|") $< > $@
endef

# One cargo invocation builds the crate's static library, and only that: rustc's own link of a cdylib would
# fail on the symbol versions that --cfg sqdisc_symbol_versions assembles (src/capi/compat.rs), having no
# node for them. rustc's note on the native libraries a static link needs (replayed by cargo when nothing was
# rebuilt) becomes the Libs.private of sqdisc.pc. The archive is copied at once, so that nothing else that cargo
# writes to the same path can change it under the rules below.
cargo-release:
	@mkdir -p $(BUILD)/obj
	$(CARGO) rustc --release --lib --features capi --crate-type staticlib -- --cfg sqdisc_symbol_versions --print native-static-libs 2>&1 \
		| tee $(BUILD)/cargo-release.log
	cp -f $(RELEASE_DIR)/$(LIB_A) $(BUILD)/obj/libsqdisc-capi.a
	$(call native_static_libs,cargo-release.log,native-static-libs,-libverbs)

# Both libraries come from cargo's staticlib, which carries the whole Rust standard library with global
# symbols, linked into one object without the embedded LLVM bitcode (other toolchains' linker plugins choke
# on it).
$(BUILD)/obj/sqdisc-merged.o: cargo-release
	@mkdir -p $(@D)
	$(LD_R) -r --whole-archive $(BUILD)/obj/libsqdisc-capi.a -o $@
	$(OBJCOPY) --remove-section=.llvmbc --remove-section=.llvmcmd $@

# The shared library is linked here, not by rustc: rustc's own export list for a cdylib would put every
# sqd_* function in the base version, unversioned, whatever version script is added to it. The export map
# names each function and its version node (only those leave libsqdisc.so, so two Rust-built libraries in
# one C program cannot clash).
$(BUILD)/lib/$(LIB_REAL): $(BUILD)/obj/sqdisc-merged.o src/capi/sqdisc.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< -Wl,-soname,$(LIB_SONAME) -Wl,--version-script=$(CURDIR)/src/capi/sqdisc.map \
		-Wl,-z,relro,-z,now -Wl,--gc-sections $$(cat $(BUILD)/native-static-libs) -libverbs
	ln -sfn $(LIB_REAL) $(@D)/$(LIB_SONAME)
	ln -sfn $(LIB_SONAME) $(@D)/$(LIB_SO)

# The archive: every symbol but the sqd_* functions made local, in a single object. A static link has no
# symbol versions: a default version (name@@NODE, src/capi/compat.rs) gets its plain name back, an older one
# (name@NODE) is made local.
$(BUILD)/lib/$(LIB_A): $(BUILD)/obj/sqdisc-merged.o
	@mkdir -p $(@D)
	$(NM) -g --defined-only $< | awk '$$3 ~ /^sqd_[A-Za-z0-9_]+@@/ { n = $$3; sub(/@@.*/, "", n); print $$3, n }' \
		> $(BUILD)/obj/sqdisc.unversion
	$(OBJCOPY) --redefine-syms=$(BUILD)/obj/sqdisc.unversion $< $(BUILD)/obj/sqdisc-plain.o
	$(NM) -g --defined-only $(BUILD)/obj/sqdisc-plain.o | awk '$$3 ~ /^sqd_[A-Za-z0-9_]+$$/ { print $$3 }' \
		> $(BUILD)/obj/sqdisc.keep
	@test -s $(BUILD)/obj/sqdisc.keep || { echo "error: no sqd_* symbol in $(RELEASE_DIR)/$(LIB_A)" >&2; exit 1; }
	$(OBJCOPY) --keep-global-symbols=$(BUILD)/obj/sqdisc.keep $(BUILD)/obj/sqdisc-plain.o $(BUILD)/obj/sqdisc.o
	rm -f $@ && $(AR) rcs $@ $(BUILD)/obj/sqdisc.o

# ---- libsqdisc_sim and the test-only libsqdisc_scripted ---------------------------------------------------

# The staticlib of the crate of the test devices (sim/, sqdisc-sim, features capi,scripted), which does not
# depend on sqdisc: no copy of the core is in it. Merged into one object as above; libsqdisc_sim keeps global
# only its sqd_sim_* functions and libsqdisc_scripted only sqd_scripted_*, the Rust code they carry (the
# model, the standard library, the device seam's crate) stays local. At run time the seam's copy finds
# libsqdisc's device registry and last error through the first sqd_device_* in global scope (device/src/lib.rs):
# the shared libraries need libsqdisc.so (DT_NEEDED); a static link exports the program's sqd_device_*
# (sqdisc_sim.pc's Libs.private).
sim-lib: $(BUILD)/lib/$(SIM_REAL) $(BUILD)/lib/$(SIM_A) $(BUILD)/sqdisc_sim.pc
scripted-lib: $(SCRIPTED_LIBDIR)/libsqdisc_scripted.so $(SCRIPTED_LIBDIR)/libsqdisc_scripted.a

sim-cargo-release:
	@mkdir -p $(BUILD)/obj
	$(CARGO) rustc -p sqdisc-sim --release --lib --features capi,scripted --crate-type staticlib -- --print native-static-libs 2>&1 \
		| tee $(BUILD)/sim-cargo-release.log
	cp -f $(RELEASE_DIR)/$(SIM_A) $(BUILD)/obj/libsqdisc-devices.a
	$(call native_static_libs,sim-cargo-release.log,sim-native-static-libs,-libverbs)

$(BUILD)/obj/sqdisc_devices-merged.o: sim-cargo-release
	@mkdir -p $(@D)
	$(LD_R) -r --whole-archive $(BUILD)/obj/libsqdisc-devices.a -o $@
	$(OBJCOPY) --remove-section=.llvmbc --remove-section=.llvmcmd $@

# $(call device_object,PREFIX): $@ from the merged object with only the PREFIX* functions global.
define device_object
	$(NM) -g --defined-only $< | awk '$$2 == "T" && $$3 ~ /^$(1)[A-Za-z0-9_]+$$/ { print $$3 }' > $@.keep
	@test -s $@.keep || { echo "error: no $(1)* function in $<" >&2; exit 1; }
	$(OBJCOPY) --keep-global-symbols=$@.keep $< $@
endef

$(BUILD)/obj/sqdisc_sim.o: $(BUILD)/obj/sqdisc_devices-merged.o
	$(call device_object,sqd_sim_)

$(BUILD)/obj/sqdisc_scripted.o: $(BUILD)/obj/sqdisc_devices-merged.o
	$(call device_object,sqd_scripted_)

$(BUILD)/lib/$(SIM_REAL): $(BUILD)/obj/sqdisc_sim.o sim/sqdisc_sim.map $(BUILD)/lib/$(LIB_REAL)
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< -Wl,-soname,$(SIM_SONAME) -Wl,--version-script=$(CURDIR)/sim/sqdisc_sim.map \
		-Wl,-z,relro,-z,now -Wl,--gc-sections $$(cat $(BUILD)/sim-native-static-libs) \
		-Wl,--no-as-needed -L$(BUILD)/lib -lsqdisc -libverbs
	ln -sfn $(SIM_REAL) $(@D)/$(SIM_SONAME)
	ln -sfn $(SIM_SONAME) $(@D)/$(SIM_SO)

$(BUILD)/lib/$(SIM_A): $(BUILD)/obj/sqdisc_sim.o
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $<

$(BUILD)/sqdisc_sim.pc: pkgconfig/sqdisc_sim.pc.in sim-cargo-release
	$(call pkgconfig_file,$(SIM_VERSION),sim-native-static-libs)

$(SCRIPTED_LIBDIR)/libsqdisc_scripted.so: $(BUILD)/obj/sqdisc_scripted.o $(BUILD)/lib/$(LIB_REAL)
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< -Wl,-soname,libsqdisc_scripted.so -Wl,-z,relro,-z,now -Wl,--gc-sections \
		$$(cat $(BUILD)/sim-native-static-libs) -Wl,--no-as-needed -L$(BUILD)/lib -lsqdisc -libverbs

$(SCRIPTED_LIBDIR)/libsqdisc_scripted.a: $(BUILD)/obj/sqdisc_scripted.o
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $<

check-sim-symbols: sim-lib
	bash scripts/check-symbols.sh --soname $(SIM_SONAME) --map sim/sqdisc_sim.map --header sqdisc_sim.h \
		$(BUILD)/lib/$(SIM_REAL) $(BUILD)/lib/$(SIM_A) include

# ---- libsqdisc_spdk --------------------------------------------------------------------------------------

# Both libraries come from the crate's staticlib, merged into one object whose only global symbols are the
# provider's: rustc's own export list for a cdylib would also export every sqd_* function of the sqdisc core
# linked into it. The shared library leaves SPDK's functions it calls (spdk_rdma_utils_*, spdk_log; and
# spdk_rdma_cm_*, weakly: spdk/src/cm.rs) undefined, to be bound to SPDK's libraries in the process that loads
# it. libibverbs and librdmacm (which every SPDK release with RDMA links too) come from sqdisc_spdk.pc's Requires.
spdk-shim: $(BUILD)/lib/$(SPDK_REAL) $(BUILD)/lib/$(SPDK_A) $(BUILD)/sqdisc_spdk.pc

spdk-cargo-release:
	@mkdir -p $(BUILD)
	$(CARGO) rustc -p sqdisc-spdk --release --lib --crate-type staticlib -- --print native-static-libs 2>&1 \
		| tee $(BUILD)/spdk-cargo-release.log
	$(call native_static_libs,spdk-cargo-release.log,spdk-native-static-libs,-libverbs -lrdmacm)

$(BUILD)/obj/sqdisc_spdk.o: spdk-cargo-release
	@mkdir -p $(@D)
	$(LD_R) -r --whole-archive $(RELEASE_DIR)/$(SPDK_A) -o $(BUILD)/obj/sqdisc_spdk-merged.o
	$(OBJCOPY) --remove-section=.llvmbc --remove-section=.llvmcmd $(BUILD)/obj/sqdisc_spdk-merged.o
	$(NM) -g --defined-only $(BUILD)/obj/sqdisc_spdk-merged.o \
		| awk '$$3 ~ /^(spdk_rdma_provider_|sqd_spdk_)/ { print $$3 }' > $(BUILD)/obj/sqdisc_spdk.keep
	@test "$$(grep -c '^spdk_rdma_provider_' $(BUILD)/obj/sqdisc_spdk.keep)" = 14 \
		|| { echo "error: $(RELEASE_DIR)/$(SPDK_A) does not define the 14 provider functions" >&2; exit 1; }
	$(OBJCOPY) --keep-global-symbols=$(BUILD)/obj/sqdisc_spdk.keep $(BUILD)/obj/sqdisc_spdk-merged.o $@

$(BUILD)/lib/$(SPDK_A): $(BUILD)/obj/sqdisc_spdk.o
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $<

$(BUILD)/lib/$(SPDK_REAL): $(BUILD)/obj/sqdisc_spdk.o
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< -Wl,-soname,$(SPDK_SONAME) -Wl,-z,relro,-z,now -Wl,--gc-sections \
		$$(cat $(BUILD)/spdk-native-static-libs) -libverbs -lrdmacm
	ln -sfn $(SPDK_REAL) $(@D)/$(SPDK_SONAME)
	ln -sfn $(SPDK_SONAME) $(@D)/$(SPDK_SO)

$(BUILD)/sqdisc_spdk.pc: pkgconfig/sqdisc_spdk.pc.in spdk-cargo-release
	$(call pkgconfig_file,$(SPDK_VERSION),spdk-native-static-libs)

check-spdk-symbols: spdk-shim
	bash scripts/check-spdk-symbols.sh $(BUILD)/lib/$(SPDK_REAL) $(BUILD)/lib/$(SPDK_A) $(SPDK_SONAME)

# ---- the device daemon and its preload library ---------------------------------------------------------------

simdev: $(BUILD)/bin/$(SIMDEV_BIN) $(BUILD)/lib/$(SIMDEV_PRELOAD)

# One cargo invocation for both (they share the proto crate); cargo decides whether anything is rebuilt.
simdev-cargo-release:
	$(CARGO) build --release -p sqdisc-sim-daemon -p sqdisc-sim-preload

$(BUILD)/bin/$(SIMDEV_BIN): simdev-cargo-release
	@mkdir -p $(@D)
	cp -f $(RELEASE_DIR)/$(SIMDEV_BIN) $@

$(BUILD)/lib/$(SIMDEV_PRELOAD): simdev-cargo-release
	@mkdir -p $(@D)
	cp -f $(RELEASE_DIR)/$(SIMDEV_PRELOAD) $@

# ---- libsqdisc_check ------------------------------------------------------------------------------------

# As libsqdisc_spdk: the crate's staticlib merged into one object whose only global symbols are the interposed
# libibverbs functions and sqd_check_*, linked into a shared library with an explicit export map
# (check/sqdisc_check.map). It does not link the sqdisc core. Only the shared library is built: interposition
# is what it is for.
check-lib: $(BUILD)/lib/$(CHECK_REAL) $(BUILD)/sqdisc_check.pc

check-cargo-release:
	@mkdir -p $(BUILD)
	$(CARGO) rustc -p sqdisc-check --release --lib --crate-type staticlib -- --cfg sqdisc_check_library \
		--print native-static-libs 2>&1 | tee $(BUILD)/check-cargo-release.log
	$(call native_static_libs,check-cargo-release.log,check-native-static-libs,-libverbs -lrdmacm)

$(BUILD)/obj/sqdisc_check.o: check-cargo-release
	@mkdir -p $(@D)
	$(LD_R) -r --whole-archive $(RELEASE_DIR)/libsqdisc_check.a -o $(BUILD)/obj/sqdisc_check-merged.o
	$(OBJCOPY) --remove-section=.llvmbc --remove-section=.llvmcmd $(BUILD)/obj/sqdisc_check-merged.o
	$(NM) -g --defined-only $(BUILD)/obj/sqdisc_check-merged.o \
		| awk '$$3 ~ /^(sqd_check_|ibv_)/ { print $$3 }' > $(BUILD)/obj/sqdisc_check.keep
	@test "$$(grep -c '^ibv_' $(BUILD)/obj/sqdisc_check.keep)" = 11 \
		|| { echo "error: $(RELEASE_DIR)/libsqdisc_check.a does not define the 11 interposed functions" >&2; exit 1; }
	$(OBJCOPY) --keep-global-symbols=$(BUILD)/obj/sqdisc_check.keep $(BUILD)/obj/sqdisc_check-merged.o $@

$(BUILD)/lib/$(CHECK_REAL): $(BUILD)/obj/sqdisc_check.o check/sqdisc_check.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $< -Wl,-soname,$(CHECK_SONAME) -Wl,--version-script=$(CURDIR)/check/sqdisc_check.map \
		-Wl,-z,relro,-z,now -Wl,--gc-sections -Wl,--as-needed $$(cat $(BUILD)/check-native-static-libs) -libverbs
	ln -sfn $(CHECK_REAL) $(@D)/$(CHECK_SONAME)
	ln -sfn $(CHECK_SONAME) $(@D)/$(CHECK_SO)

$(BUILD)/sqdisc_check.pc: pkgconfig/sqdisc_check.pc.in check-cargo-release
	$(call pkgconfig_file,$(CHECK_VERSION))

check-check-symbols: check-lib
	bash scripts/check-checker-symbols.sh $(BUILD)/lib/$(CHECK_REAL) $(CHECK_SONAME) check/include/sqdisc_check.h

# The checker's C tests on the software HCA and the demo comparison (scripts/check-checker.sh, docs/check.md).
check-checker:
	CC='$(CC)' bash scripts/check-checker.sh $(STAGE) $(STAGE_LIBDIR)

$(BUILD)/sqdisc.pc: pkgconfig/sqdisc.pc.in cargo-release
	$(call pkgconfig_file,$(VERSION),native-static-libs)

# ---- install ---------------------------------------------------------------------------------------------

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR)
	install -m 0755 $(BUILD)/lib/$(LIB_REAL) $(DESTDIR)$(LIBDIR)/$(LIB_REAL)
	ln -sfn $(LIB_REAL) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sfn $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/$(LIB_SO)
	install -m 0644 $(BUILD)/lib/$(LIB_A) $(DESTDIR)$(LIBDIR)/$(LIB_A)
	install -m 0644 $(wildcard include/*.h) $(DESTDIR)$(INCLUDEDIR)/
	install -m 0644 $(BUILD)/sqdisc.pc $(DESTDIR)$(PKGCONFIGDIR)/sqdisc.pc
	install -m 0755 $(BUILD)/lib/$(SIM_REAL) $(DESTDIR)$(LIBDIR)/$(SIM_REAL)
	ln -sfn $(SIM_REAL) $(DESTDIR)$(LIBDIR)/$(SIM_SONAME)
	ln -sfn $(SIM_SONAME) $(DESTDIR)$(LIBDIR)/$(SIM_SO)
	install -m 0644 $(BUILD)/lib/$(SIM_A) $(DESTDIR)$(LIBDIR)/$(SIM_A)
	install -m 0644 $(BUILD)/sqdisc_sim.pc $(DESTDIR)$(PKGCONFIGDIR)/sqdisc_sim.pc
	install -m 0755 $(BUILD)/lib/$(SPDK_REAL) $(DESTDIR)$(LIBDIR)/$(SPDK_REAL)
	ln -sfn $(SPDK_REAL) $(DESTDIR)$(LIBDIR)/$(SPDK_SONAME)
	ln -sfn $(SPDK_SONAME) $(DESTDIR)$(LIBDIR)/$(SPDK_SO)
	install -m 0644 $(BUILD)/lib/$(SPDK_A) $(DESTDIR)$(LIBDIR)/$(SPDK_A)
	install -m 0644 spdk/include/sqdisc_spdk.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 0644 $(BUILD)/sqdisc_spdk.pc $(DESTDIR)$(PKGCONFIGDIR)/sqdisc_spdk.pc
	install -m 0755 $(BUILD)/lib/$(CHECK_REAL) $(DESTDIR)$(LIBDIR)/$(CHECK_REAL)
	ln -sfn $(CHECK_REAL) $(DESTDIR)$(LIBDIR)/$(CHECK_SONAME)
	ln -sfn $(CHECK_SONAME) $(DESTDIR)$(LIBDIR)/$(CHECK_SO)
	install -m 0644 check/include/sqdisc_check.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 0644 $(BUILD)/sqdisc_check.pc $(DESTDIR)$(PKGCONFIGDIR)/sqdisc_check.pc
	install -d $(DESTDIR)$(BINDIR)
	install -m 0755 $(BUILD)/bin/$(SIMDEV_BIN) $(DESTDIR)$(BINDIR)/$(SIMDEV_BIN)
	install -m 0755 $(BUILD)/lib/$(SIMDEV_PRELOAD) $(DESTDIR)$(LIBDIR)/$(SIMDEV_PRELOAD)

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/$(LIB_REAL) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME) $(DESTDIR)$(LIBDIR)/$(LIB_SO)
	rm -f $(DESTDIR)$(LIBDIR)/$(LIB_A)
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(wildcard include/*.h)))
	rm -f $(DESTDIR)$(PKGCONFIGDIR)/sqdisc.pc
	rm -f $(DESTDIR)$(LIBDIR)/$(SIM_REAL) $(DESTDIR)$(LIBDIR)/$(SIM_SONAME) $(DESTDIR)$(LIBDIR)/$(SIM_SO)
	rm -f $(DESTDIR)$(LIBDIR)/$(SIM_A) $(DESTDIR)$(PKGCONFIGDIR)/sqdisc_sim.pc
	rm -f $(DESTDIR)$(LIBDIR)/$(SPDK_REAL) $(DESTDIR)$(LIBDIR)/$(SPDK_SONAME) $(DESTDIR)$(LIBDIR)/$(SPDK_SO)
	rm -f $(DESTDIR)$(LIBDIR)/$(SPDK_A) $(DESTDIR)$(INCLUDEDIR)/sqdisc_spdk.h $(DESTDIR)$(PKGCONFIGDIR)/sqdisc_spdk.pc
	rm -f $(DESTDIR)$(LIBDIR)/$(CHECK_REAL) $(DESTDIR)$(LIBDIR)/$(CHECK_SONAME) $(DESTDIR)$(LIBDIR)/$(CHECK_SO)
	rm -f $(DESTDIR)$(INCLUDEDIR)/sqdisc_check.h $(DESTDIR)$(PKGCONFIGDIR)/sqdisc_check.pc
	rm -f $(DESTDIR)$(BINDIR)/$(SIMDEV_BIN) $(DESTDIR)$(LIBDIR)/$(SIMDEV_PRELOAD)

# ---- headers ---------------------------------------------------------------------------------------------

header:
	SQDISC_UPDATE_HEADERS=1 $(CARGO) test --test header -- --nocapture

check-headers:
	CC='$(CC)' CXX='$(CXX)' bash scripts/check-headers.sh include

# ---- checks ----------------------------------------------------------------------------------------------

test:
	$(CARGO) test --workspace --features sqdisc/capi,sqdisc-sim/capi,sqdisc-sim/scripted --no-fail-fast

check-rlib-symbols:
	CARGO='$(CARGO)' bash scripts/check-rlib-symbols.sh

check-symbols: all check-sim-symbols
	bash scripts/check-symbols.sh --soname $(LIB_SONAME) $(BUILD)/lib/$(LIB_REAL) $(BUILD)/lib/$(LIB_A) include

stage:
	rm -rf $(STAGE)
	$(MAKE) --no-print-directory install $(STAGE_VARS)
	touch $(STAGE)/.installed

check-installed-symbols:
	bash scripts/check-symbols.sh --soname $(LIB_SONAME) $(STAGE)$(STAGE_LIBDIR)/$(LIB_SO) \
		$(STAGE)$(STAGE_LIBDIR)/$(LIB_A) $(STAGE)$(STAGE_PREFIX)/include
	bash scripts/check-symbols.sh --soname $(SIM_SONAME) --map sim/sqdisc_sim.map --header sqdisc_sim.h \
		$(STAGE)$(STAGE_LIBDIR)/$(SIM_SO) $(STAGE)$(STAGE_LIBDIR)/$(SIM_A) $(STAGE)$(STAGE_PREFIX)/include

# Unmodified verbs programs (ibv_*_pingpong, perftest, and through librdmacm rping, ucmatose, rdma_server and
# rdma_client, perftest -R, qperf) on the device daemon, run from the staged install: plain, under request and
# ACK loss, and under libsqdisc_check (scripts/sim-matrix.sh). About five minutes.
sim-matrix:
	bash scripts/sim-matrix.sh $(STAGE)$(STAGE_PREFIX)

# The device daemon's faults with the C programs of c-tests/sim_device/ (scripts/sim-device-tests.sh); malformed
# messages are simdev/daemon/tests/faults.rs, in make test.
sim-device-tests:
	CC='$(CC)' bash scripts/sim-device-tests.sh $(STAGE)$(STAGE_PREFIX)

c-tests: scripted-lib
	CC='$(CC)' bash scripts/c-tests.sh $(STAGE) $(STAGE_LIBDIR) $(CURDIR)/$(SCRIPTED_LIBDIR)

# libsqdisc_spdk replacing, preloaded before, or linked in place of SPDK's provider (docs/spdk.md), in a
# stand-in of each SPDK release of spdk/releases/ (first compared with ../shared/spdk when that exists).
check-spdk-dropin:
	bash scripts/spdk-releases.sh check
	CC='$(CC)' bash scripts/check-spdk-dropin.sh $(STAGE) $(STAGE_LIBDIR)

check-install:
	bash scripts/check-install.sh '$(MAKE)'

check:
	$(MAKE) --no-print-directory deps
	$(MAKE) --no-print-directory test
	$(MAKE) --no-print-directory check-rlib-symbols
	$(MAKE) --no-print-directory miri
	$(MAKE) --no-print-directory tsan
	$(MAKE) --no-print-directory check-headers
	$(MAKE) --no-print-directory all
	$(MAKE) --no-print-directory check-symbols
	$(MAKE) --no-print-directory check-spdk-symbols
	$(MAKE) --no-print-directory check-check-symbols
	$(MAKE) --no-print-directory stage
	$(MAKE) --no-print-directory check-installed-symbols
	$(MAKE) --no-print-directory sim-matrix
	$(MAKE) --no-print-directory sim-device-tests
	$(MAKE) --no-print-directory simdev-tests
	$(MAKE) --no-print-directory c-tests
	$(MAKE) --no-print-directory check-spdk-dropin
	$(MAKE) --no-print-directory check-checker
	$(MAKE) --no-print-directory fuzz-smoke
	$(MAKE) --no-print-directory bench-guard
	$(MAKE) --no-print-directory check-install
	@echo 'make check: all steps passed'

# Undefined-behaviour check of the discipline core and the C ABI (callbacks re-entering it, every teardown
# order) under Miri; what runs and which flags are in scripts/miri.sh. About two minutes.
.PHONY: miri
miri:
	bash scripts/miri.sh

# c-tests/threads.c under ThreadSanitizer, against a libsqdisc.so instrumented with nightly -Zsanitizer=thread
# -Zbuild-std (docs/testing.md): a probe proves a race in the library is reported, then the run must be clean.
.PHONY: tsan
tsan:
	CC='$(CC)' bash scripts/tsan.sh

# The target-scale tests of tests/target.rs scaled up by SQDISC_SOAK=1 (more seeds, connections run longer,
# more traffic through the 10,000 queues): minutes. A debug build, so the library's debug assertions run too.
# Then the fault campaign of tests/campaign.rs for SQDISC_CAMPAIGN_SECS seconds (default 600; hours are fine),
# or SQDISC_CAMPAIGN_CASES cases, from SQDISC_CAMPAIGN_SEED; it ends by printing the cases run and the faults
# injected (docs/testing.md).
.PHONY: soak
soak:
	SQDISC_SOAK=1 $(CARGO) test --test target -- --nocapture --test-threads=1
	SQDISC_SOAK=1 $(CARGO) test --test campaign fault_campaign -- --nocapture --test-threads=1

# ---- examples --------------------------------------------------------------------------------------------

# examples/NAME.c -> build/examples/NAME, built only from the staged install through pkg-config.
$(BUILD)/examples/%: examples/%.c $(STAGE)/.installed
	@mkdir -p $(@D)
	$(CC) $(C_STRICT) -g $$($(STAGE_PKG_CONFIG) --cflags sqdisc sqdisc_sim) $< -o $@ \
		$$($(STAGE_PKG_CONFIG) --libs sqdisc sqdisc_sim) -Wl,-rpath,$(STAGE)$(STAGE_LIBDIR)

$(STAGE)/.installed:
	$(MAKE) --no-print-directory stage

demo:
	$(MAKE) --no-print-directory deps-build
	$(MAKE) --no-print-directory stage
	$(MAKE) --no-print-directory $(BUILD)/examples/demo
	./$(BUILD)/examples/demo

clean:
	rm -rf $(BUILD)
	$(CARGO) clean

# ---- benchmarks ------------------------------------------------------------------------------------------

# Built against a private staged install, so that a concurrent `make stage` cannot swap the library mid-run.
BENCH_STAGE := $(CURDIR)/$(BUILD)/bench/stage
BENCH_STAGE_VARS := DESTDIR=$(BENCH_STAGE) PREFIX=$(STAGE_PREFIX) LIBDIR=$(STAGE_LIBDIR) \
	INCLUDEDIR=$(STAGE_PREFIX)/include PKGCONFIGDIR=$(STAGE_LIBDIR)/pkgconfig

.PHONY: bench bench-guard bench-stage bench-spdk bench-check

bench-stage:
	rm -rf $(BENCH_STAGE)
	$(MAKE) --no-print-directory install $(BENCH_STAGE_VARS)

# Instructions, CQEs, doorbells, allocations per WR on the null provider (benches/null_provider.c) and the
# software HCA, memory, scaling, profiles: docs/PERFORMANCE.md, docs/perf/.
bench:
	$(MAKE) --no-print-directory bench-stage
	CC='$(CC)' CARGO='$(CARGO)' bash scripts/bench.sh $(BENCH_STAGE) $(STAGE_LIBDIR)
	$(MAKE) --no-print-directory bench-sim

# 64-byte SENDs between two processes through the device daemon (perftest), against the in-process sim:
# wall-clock medians, written to docs/perf/sim-device.txt (scripts/bench-sim.sh). About a minute.
bench-sim:
	CARGO='$(CARGO)' bash scripts/bench-sim.sh

# Cheap, untimed regression guard: no allocation per WR, instruction ratios against hand-moderated raw verbs
# (on the null provider: today's ratios with 15% margin, limits at the top of scripts/bench-guard.sh).
bench-guard:
	$(MAKE) --no-print-directory bench-stage
	CC='$(CC)' bash scripts/bench-guard.sh $(BENCH_STAGE) $(STAGE_LIBDIR)
	CC='$(CC)' bash scripts/bench-spdk.sh $(BENCH_STAGE) $(STAGE_LIBDIR) --guard

# What libsqdisc_check costs per WR on the null provider (docs/check.md's table).
bench-check:
	$(MAKE) --no-print-directory bench-stage
	CC='$(CC)' bash scripts/bench-check.sh $(BENCH_STAGE) $(STAGE_LIBDIR)

# The SPDK provider against SPDK's verbs provider's behaviour, instructions per WR: a table in docs/spdk.md.
bench-spdk:
	$(MAKE) --no-print-directory bench-stage
	CC='$(CC)' bash scripts/bench-spdk.sh $(BENCH_STAGE) $(STAGE_LIBDIR)

# ---- fuzzing ----------------------------------------------------------------------------------------------

# The C API under libFuzzer with AddressSanitizer (fuzz/, scripts/fuzz.sh; docs/testing.md). fuzz-smoke replays
# the seed corpus and fuzzes briefly with a fixed seed; fuzz runs FUZZ_SECONDS and reports executions and coverage.
.PHONY: fuzz fuzz-smoke
FUZZ_SECONDS ?= 600

fuzz-smoke:
	bash scripts/fuzz.sh smoke

fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh long

# Real SPDK end to end over the sim device (scripts/spdk-e2e.sh; docs/spdk.md): builds the SPDK tree of SPDK_SRC
# into build/e2e/ (or uses SPDK_BUILD), then runs its target and host with SPDK's provider and with
# libsqdisc_spdk. Needs an SPDK tree and minutes; not part of check.
.PHONY: e2e-spdk
e2e-spdk:
	bash scripts/spdk-e2e.sh

# C programs on the sim device, through sqdisc-sim and its preload library (c-tests/simdev/*.c).
.PHONY: simdev-tests
simdev-tests:
	bash scripts/simdev-tests.sh
