"""Command-line options, as pytorch/xla's test/args_parse.py gives them to its training scripts."""
import argparse


def parse_common_options(batch_size=8, num_epochs=2, lr=0.1):
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=batch_size)
    parser.add_argument("--num_epochs", type=int, default=num_epochs)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--num_cores", type=int, default=2)
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--log_steps", type=int, default=4)
    return parser.parse_args()
