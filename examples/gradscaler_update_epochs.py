# From the GradScaler.update documentation: a training loop over epochs
# calling `scaler.update(optimizer)`; only the import changed.
import torch
from torchext.amp import GradScaler

torch.manual_seed(0)

model = torch.nn.Linear(10, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
scaler = GradScaler()

data = torch.randn(20, 10)
target = torch.randn(20, 1)

for epoch in range(3):
	optimizer.zero_grad()

	with torch.cuda.amp.autocast():
		output = model(data)
		loss = torch.nn.functional.mse_loss(output, target)

	scaler.scale(loss).backward()
	scaler.step(optimizer)
	scaler.update(optimizer)

	print(f"Epoch {epoch + 1}: loss = {loss.item():.4f}")
