# From the GradScaler.update documentation this project implements, with only
# the import changed: `scaler.update(optimizer)` works with torchext.
import torch
from torchext.amp import GradScaler

torch.manual_seed(0)

model = torch.nn.Linear(10, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = GradScaler()

data = torch.randn(5, 10)
target = torch.randn(5, 1)

with torch.cuda.amp.autocast():
	output = model(data)
	loss = torch.nn.functional.mse_loss(output, target)

scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update(optimizer)

print("Scale update done")
