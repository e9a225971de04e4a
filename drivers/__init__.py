"""The real device drivers (ITLA, WSS, power meter) over their wire protocols; emulators are in `drivers.emulators`."""
