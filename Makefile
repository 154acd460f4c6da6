# Benchmark harness (bench/harness). Needs a release build and root (cgroups, zram swap).
#   make bench-quick   smoke sweep, small sizes, a few minutes -> bench/results/harness-quick.json
#   make bench         full sweep, ~30-40 minutes                -> bench/results/harness-full.json
#   make bench-test    the harness's own tests (cgroup/zram teardown, JSON completeness)
#   make bench-clean   undo whatever an interrupted harness left behind (idempotent)
#
# Installation (after `cargo build --release`; `make install` never builds, so it can run as root
# on a tree a user built):
#   make install                       binaries, libraries, headers, systemd units, their
#                                      environment files (kept if present), docs
#   make install PREFIX=/usr           under /usr instead of /usr/local
#   make install DESTDIR=/tmp/pkg      staged (for packaging): paths inside files stay PREFIX's
#   make uninstall                     removes what install put there (not the environment files
#                                      or the token directory)
# Then: systemctl daemon-reload && systemctl enable --now gleaner-memnode (and gleaner-node).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DOCDIR ?= $(PREFIX)/share/doc/gleaner
SYSCONFDIR ?= /etc
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
RELEASE := target/release
UNITS := gleaner-memnode.service gleaner-node.service
SUBST = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g'

PYTHON ?= $(shell python3 -c 'import os,sys; print(os.path.realpath(sys.executable))')

.PHONY: install uninstall install-check bench bench-quick bench-setup bench-build bench-test bench-clean bench-render

bench-build:
	cargo build --release

bench-setup:
	PYTHON=$(PYTHON) bash bench/harness/setup.sh

bench-quick: bench-build bench-setup
	$(PYTHON) -m bench.harness quick

bench: bench-build bench-setup
	$(PYTHON) -m bench.harness full

bench-render:
	$(PYTHON) -m bench.harness render

bench-test: bench-setup
	$(PYTHON) -m pytest bench/tests -q

bench-clean:
	$(PYTHON) -m bench.harness cleanup

install-check:
	@for f in gleaner gleaner-memnode libgleaner_preload.so libgleaner.so libgleaner_soft.so; do \
	    [ -f $(RELEASE)/$$f ] || { echo "make install: $(RELEASE)/$$f is missing: run cargo build --release first" >&2; exit 1; }; \
	done

install: install-check
	install -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSCONFDIR)/default
	install -m 0755 $(RELEASE)/gleaner $(RELEASE)/gleaner-memnode $(DESTDIR)$(BINDIR)/
	install -m 0755 $(RELEASE)/libgleaner_preload.so $(RELEASE)/libgleaner.so \
	    $(RELEASE)/libgleaner_soft.so $(DESTDIR)$(LIBDIR)/
	install -m 0644 include/gleaner.h include/gleaner_soft.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 0644 docs/operations.md $(DESTDIR)$(DOCDIR)/
	for u in $(UNITS); do \
	    $(SUBST) packaging/systemd/$$u.in > $(DESTDIR)$(SYSTEMDUNITDIR)/$$u && \
	    chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/$$u || exit 1; \
	done
	@# The environment files are the operator's once installed: never overwritten.
	for e in gleaner-memnode gleaner-node; do \
	    [ -e $(DESTDIR)$(SYSCONFDIR)/default/$$e ] || \
	    $(SUBST) packaging/default/$$e > $(DESTDIR)$(SYSCONFDIR)/default/$$e || exit 1; \
	done
	@# The memnode's token is generated here on its first start (owner-only).
	install -d -m 0700 $(DESTDIR)$(SYSCONFDIR)/gleaner
	@echo "installed; now: systemctl daemon-reload && systemctl enable --now gleaner-memnode"

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/gleaner $(DESTDIR)$(BINDIR)/gleaner-memnode \
	    $(DESTDIR)$(LIBDIR)/libgleaner_preload.so $(DESTDIR)$(LIBDIR)/libgleaner.so \
	    $(DESTDIR)$(LIBDIR)/libgleaner_soft.so $(DESTDIR)$(INCLUDEDIR)/gleaner.h \
	    $(DESTDIR)$(INCLUDEDIR)/gleaner_soft.h $(DESTDIR)$(DOCDIR)/operations.md
	for u in $(UNITS); do rm -f $(DESTDIR)$(SYSTEMDUNITDIR)/$$u; done
