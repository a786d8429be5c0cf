"""The project's own CPU ops, written in C++ and built once per machine (`structspec_ops.build`).

The lowest layer: it imports no other package of the project. Each op has a Python wrapper here that says whether
the op could be built on this machine (`structspec_ops.build.Built`), and the layers above fall back, with one line of
reason, where it could not.
"""
