"""The OptINC model: levels and digits, MZI meshes, the optical network, its design and hardware-aware training."""
