"""Fine-tuning with the Hugging Face Trainer as AWS's torch-neuronx samples and tutorial do it on XLA
(hf_sentiment_analysis, hf_bert_jp_text_classification): torchrun starts the processes, the XLA process group is
joined by hand, and the Trainer is patched so that it does not wrap the model for distributed training."""
import os

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from data import TokenSet

# Enable torchrun
import torch_xla.distributed.xla_backend
if os.environ.get("WORLD_SIZE"):
    torch.distributed.init_process_group("xla")

# Fixup to enable distributed training with XLA
orig_wrap_model = Trainer._wrap_model
def _wrap_model(self, model, training=True):
    self.args.local_rank = -1
    return orig_wrap_model(self, model, training)
Trainer._wrap_model = _wrap_model


if __name__ == '__main__':
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir="out", num_train_epochs=2, per_device_train_batch_size=8, learning_rate=1e-3,
                             report_to=[], save_strategy="no", logging_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=TokenSet())
    result = trainer.train()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    p = next(trainer.model.parameters())
    checksum = sum(float(q.detach().double().sum().cpu()) for q in trainer.model.parameters())
    print(f"rank {rank} world {world} device {p.device.type} steps {result.global_step} loss {result.training_loss:.4f} "
          f"checksum {checksum:.6f}")
