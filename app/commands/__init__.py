"""Tool subcommands of ``lvrl`` that are not Lightning trainer entry points.

``lvrl data ...`` and ``lvrl model ...`` live here.

Each module exposes ``register(subparsers)``, adding one argparse sub-command whose handler
is stored as the ``run`` default (called with the parsed namespace).
"""
