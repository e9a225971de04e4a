"""Device emulators that speak the real wire protocols, the emulated fabric and the host that serves them."""
