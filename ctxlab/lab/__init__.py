"""The interactive lab: a local web page over the planner (`ctxlab lab`).

Change one input at a time and watch four figures that must never be mixed up: logical bytes
per token (representation), physical state after page rounding and page waste (allocation),
and prefix bytes avoided (sharing). The numbers come from `ctxlab.plan` through `/api/plan`;
the page only lays them out. Standard library only, no torch.
"""

from ctxlab.lab.api import lab_meta, plan_response
from ctxlab.lab.server import make_server, server_url, start_in_thread

__all__ = ["lab_meta", "make_server", "plan_response", "server_url", "start_in_thread"]
