"""A repository script (bench/..., tools/...) imported as a module by its path, for the tests of its functions."""
import importlib.util
import pathlib


def load_script(path, name=None):
    path = pathlib.Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
