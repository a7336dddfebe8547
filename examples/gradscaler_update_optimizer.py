# From the GradScaler.update documentation this project implements, with only
# the import changed: `scaler.update(optimizer)` works with torchext.
import torch
from torchext.amp import GradScaler

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
# autocast's low-precision dtype: float16 on CUDA, bfloat16 on CPU.
dtype = torch.float16 if device == "cuda" else torch.bfloat16

model = torch.nn.Linear(10, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = GradScaler(device)

data = torch.randn(5, 10, device=device)
target = torch.randn(5, 1, device=device)

with torch.autocast(device, dtype=dtype):
    output = model(data)
    loss = torch.nn.functional.mse_loss(output.float(), target)

scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update(optimizer)

print("Scale update done")
