# From the GradScaler.update documentation: a training loop over epochs
# calling `scaler.update(optimizer)`; only the import changed.
import torch
from torchext.amp import GradScaler

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
# autocast's low-precision dtype: float16 on CUDA, bfloat16 on CPU.
dtype = torch.float16 if device == "cuda" else torch.bfloat16

model = torch.nn.Linear(10, 1).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
scaler = GradScaler(device)

data = torch.randn(20, 10, device=device)
target = torch.randn(20, 1, device=device)

for epoch in range(3):
    optimizer.zero_grad()

    with torch.autocast(device, dtype=dtype):
        output = model(data)
        loss = torch.nn.functional.mse_loss(output.float(), target)

    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update(optimizer)

    print(f"Epoch {epoch + 1}: loss = {loss.item():.4f}")
