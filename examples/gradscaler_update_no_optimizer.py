# From the GradScaler.update documentation: the scale is driven by hand,
# without any optimizer. `update(new_scale)` sets it; `update()` with no
# argument needs the inf checks of a `step`/`unscale_` since the last update
# and says so when there are none. Only the import changed.
import torch
from torchext.amp import GradScaler

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

scaler = GradScaler(device, init_scale=2.0**10)
weight = torch.randn(3, 5, device=device, requires_grad=True)
data = torch.randn(4, 5, device=device)
target = torch.randn(4, 3, device=device)

loss = torch.nn.functional.mse_loss(data @ weight.t(), target)
scaler.scale(loss).backward()
print(f"scaled grad norm / scale = {weight.grad.norm().item() / scaler.get_scale():.4f}")

scaler.update(2.0**8)  # a float...
print(f"scale after update(2.0**8): {scaler.get_scale():g}")
scaler.update(torch.tensor(2.0**12, device=device))  # ...or a 1-element tensor
print(f"scale after update(tensor(2.0**12)): {scaler.get_scale():g}")

try:
    scaler.update()
except AssertionError as e:
    print(f"update() without a step: {e}")
