"""Entry script: python train.py, or torchrun --nproc_per_node=2 train.py."""
from trainer.config import TrainConfig, parse_args
from trainer.engine import Trainer


def main():
    args = parse_args()
    cfg = TrainConfig(backend=args.dist_backend, steps=args.steps)
    Trainer(cfg, args).fit()


if __name__ == "__main__":
    main()
