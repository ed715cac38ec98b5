import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    config.addinivalue_line("markers", "torchrun: starts torchrun (3 interpreters): slower; its own ctest entry")
