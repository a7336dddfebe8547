# From the GradScaler.update documentation: `scaler.update()` with no
# argument; only the import changed.
import torch
from torchext.amp import GradScaler

torch.manual_seed(0)

scaler = GradScaler()
model = torch.nn.Linear(5, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

data = torch.randn(4, 5)
target = torch.randn(4, 3)

with torch.cuda.amp.autocast():
	output = model(data)
	loss = torch.nn.functional.mse_loss(output, target)

scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()

print("Update done without an optimizer")
