"""Classification on the trainer: the model and the training step."""
import torch.nn as nn
import torch_xla.core.xla_model as xm

from trainer import Trainer


class ClassifyTrainer(Trainer):
    def build_model(self):
        self.loss_fn = nn.CrossEntropyLoss()
        return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def step_fn(self, data, target):
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(data), target)
        loss.backward()
        xm.optimizer_step(self.optimizer)  # all-reduces the gradients over the replicas, then steps
        return loss
