"""Run a user's Python file (reward functions, tools, interactions) as a module of its own.

The file runs once per process under a name derived from its real path, registered in
``sys.modules`` (dataclasses and pickling look modules up there). Every failure is an error that
names the file, the config key that points at it and the line that failed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
import types


def load_user_module(path: str | os.PathLike, *, where: str, setting: str, prefix: str) -> types.ModuleType:
    """The module of the Python file at `path`; `where` starts every error message ("custom reward
    function 'f' in file 'x.py'"), `setting` is the config key to fix, `prefix` the module name's."""
    real = os.path.realpath(os.fspath(path))
    if os.path.isdir(real):
        raise IsADirectoryError(f"{where}: that is a directory; point {setting} at the .py file itself")
    if not os.path.isfile(real):
        raise FileNotFoundError(f"{where}: the file does not exist ({setting} is {os.path.abspath(path)})")
    module_name = prefix + hashlib.sha1(real.encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(module_name, real)
    if spec is None or spec.loader is None:
        raise ImportError(f"{where}: cannot be loaded as a Python module (does it end in .py?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        del sys.modules[module_name]
        raise ImportError(
            f"{where}: running the file failed: {describe_load_error(error, real)}; fix it, or run the "
            "file with python to see the full error"
        ) from error
    except BaseException:  # KeyboardInterrupt: not the file's fault, pass it on as it is
        del sys.modules[module_name]
        raise
    return module


def describe_load_error(error: BaseException, real: str) -> str:
    """ "SyntaxError: invalid syntax at line 2: `return 1 +`" or "ModuleNotFoundError: ... (line 1)"."""
    if isinstance(error, SyntaxError):
        code = (error.text or "").strip()
        other = f" of {error.filename}" if error.filename and os.path.realpath(error.filename) != real else ""
        return f"{type(error).__name__}: {error.msg} at line {error.lineno}{other}" + (
            f": `{code}`" if code else ""
        )
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == real]
    at = f" (line {lines[-1]})" if lines else ""
    return f"{type(error).__name__}: {error}{at}"


PKG_PREFIX = "pkg://"  # verl's "pkg://package.module": a module imported by its name, not a file
FILE_PREFIX = "file://"


def load_user_class(path: str, name: str, *, where: str, setting: str, prefix: str) -> type:
    """Class `name` of the Python file `path` (`file://` optional) or of verl's `pkg://package.module`.

    `where`, `setting` and `prefix` are `load_user_module`'s. Every failure is an ImportError (the module)
    or a TypeError (the name) whose message starts with `where` and lists the classes the module has.
    """
    if path.startswith(PKG_PREFIX):
        module_name = path[len(PKG_PREFIX) :].replace("/", ".")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:
            raise ImportError(
                f"{where}: importing module '{module_name}' failed ({type(error).__name__}: {error}); "
                f"make it importable, or point {setting} at the .py file"
            ) from error
    else:
        module = load_user_module(path.removeprefix(FILE_PREFIX), where=where, setting=setting, prefix=prefix)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_"))
        what = "has no" if cls is None else f"has a {type(cls).__name__}, not a class, as"
        raise TypeError(
            f"{where}: the module {what} '{name}' (classes in it: {', '.join(classes) or 'none'})"
        )
    return cls


def defined_at(obj: object) -> str:
    """The text ' (FILE line N)' where `obj` (a class or function) is defined; '' where Python cannot tell."""
    try:
        return f" ({inspect.getsourcefile(obj)} line {inspect.getsourcelines(obj)[1]})"
    except (OSError, TypeError):
        return ""
