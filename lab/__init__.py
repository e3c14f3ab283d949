"""The ``testbed`` command, benchmark grids, studies and plots."""
