# ResNet on ImageNet, batch 256, cosine by epoch.
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.0001))
param_scheduler = dict(type='CosineAnnealingLR', T_max=100, by_epoch=True, begin=0, end=100)
train_cfg = dict(by_epoch=True, max_epochs=100, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=256)
