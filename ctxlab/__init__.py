"""ctxlab: measure what long context costs and what it keeps.

OMP_WAIT_POLICY=PASSIVE (unless the user set it): with OpenMP's default spinning, a thread
waiting at a barrier burns the core its busy sibling needs whenever the CPU is shared; on a
loaded 2-core machine a decode step went from 0.14 s to 3.6 s. It is set here, before any
ctxlab module imports torch, because it only takes effect if torch is not yet loaded.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
