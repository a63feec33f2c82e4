# The only part that is not a project's: a tiny model and data set (tests/support.py).
model = dict(type='support.TinyNet')
loss_fn = dict(type='CrossEntropyLoss')
num_samples = 8  # with batch_size 4: 2 iterations an epoch
train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=num_samples),
                        sampler=dict(type='DefaultSampler', shuffle=True))
progress = False
