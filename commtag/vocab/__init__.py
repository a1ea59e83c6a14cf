"""The domain's vocabulary: what PyTorch's profiler, Kineto, NCCL/RCCL and CUDA/HIP call things, written once.

Every fact commtag relies on about names it does not choose lives here as a
table with the reason beside it, the way :data:`commtag.kernels.KERNEL_RULES`
holds the kernel categories: change a fact here and nowhere else. Both wings
read it (torch-free and pydantic-free, so ``import commtag`` stays cheap);
the sidecar format's own names and limits are in :mod:`commtag.constants`.
"""

from commtag.vocab.dtypes import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.eager import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.graphs import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.kineto import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.kernels import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.collectives import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.nccl2 import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.gloo import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.keys import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.inspector import *  # noqa: F403 - the package's face: each fact keeps its one import path
from commtag.vocab.flight_recorder import *  # noqa: F403 - the package's face: each fact keeps its one import path
