"""``materializer demo``: a broker, Redis, the pipeline and the query service on a sample stream.

The modules: ``domain`` (the sample maps' config), ``events`` (the seeded
event stream), ``producer`` (sending it on schedule), ``stack`` (starting and
stopping the services), ``monitor`` and ``display`` (what the screen shows),
``run`` (the command's flow).
"""

from materializer.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
