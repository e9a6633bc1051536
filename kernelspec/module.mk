# kernelspec/module.mk — installs the Jupyter kernelspec so `jupyter kernelspec
# list` shows txkernel. Needs only sed and install (no venv), so it works as root
# on a fresh machine. The root `make install` calls it after installing binaries.
KSPEC_DEST := $(DESTDIR)$(PREFIX)/share/jupyter/kernels/txkernel

.PHONY: kernelspec-install
kernelspec-install: kernelspec/kernel.json.in kernelspec/logo-32x32.png kernelspec/logo-64x64.png
	install -d $(KSPEC_DEST)
	sed 's|@TXKERNEL@|$(PREFIX)/bin/txkernel|' kernelspec/kernel.json.in > $(KSPEC_DEST)/kernel.json
	chmod 644 $(KSPEC_DEST)/kernel.json
	install -m 644 kernelspec/logo-32x32.png kernelspec/logo-64x64.png $(KSPEC_DEST)/
