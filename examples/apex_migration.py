# NVIDIA apex's amp README training loop, with only the import changed:
# `from apex import amp` -> `from torchext import amp`. Runs on CPU or CUDA.
import torch
import torch.nn.functional as F

from torchext import amp

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

# Initialization
opt_level = "O1"
model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)

data = torch.randn(64, 10, device=device)
target = data.sum(dim=1, keepdim=True)

losses = []
for step in range(60):
    optimizer.zero_grad()
    output = model(data)
    loss = F.mse_loss(output, target)
    # loss.backward() becomes:
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 5.0)
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())

# Save and restore, as in apex's README
checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
              "amp": amp.state_dict()}
amp.load_state_dict(checkpoint["amp"])

print(f"opt_level {opt_level} on {device}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
      f"loss scale {checkpoint['amp']['loss_scaler0']['loss_scale']:g}")
assert losses[-1] < losses[0]
print("loss went down")
