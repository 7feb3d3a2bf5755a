"""``torchrun ... -m services.hosts``: join a job as a host that owns some of the clock's stages."""

import sys

from services.hosts.job import serve

if __name__ == "__main__":
    sys.exit(serve())
