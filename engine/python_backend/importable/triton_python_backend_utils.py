"""The module Triton Python models import (`import triton_python_backend_utils as pb_utils`).

hubserve puts this folder on the path of every Python-model instance (its own process, or the server for an
in-process model); the module is engine/python_backend/pb_utils.py itself, so both names are one module.
"""

import sys

from engine.python_backend import pb_utils

sys.modules[__name__] = pb_utils
