"""The real device drivers (ITLA, WSS, power meter) over their wire protocols; emulators are in `oddl.drivers.emulators`."""

if __name__ != "oddl.drivers":  # one name per module (docs/decisions/0025-one-import-root.md)
    raise ImportError(f"{__name__} is oddl's drivers/ folder: import it as oddl.drivers")
