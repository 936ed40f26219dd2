"""Transports and host bridges: the simulated ``memory`` network and ``tcp``."""
