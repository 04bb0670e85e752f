"""gridtune's training engine (torch.distributed). Built under issue 5."""
