"""torchrun, in a child with a deadline: argv is torchrun's."""

import sys

from torch.distributed.run import main

sys.argv = ["torchrun", *sys.argv[1:]]
main()
