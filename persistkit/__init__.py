"""persistkit: durable steps for AI agents (interim init during bootstrap)."""
from ._errors import *  # noqa: F403
from ._retry import Retry, set_testing
