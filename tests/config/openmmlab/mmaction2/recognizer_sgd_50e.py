_base_ = ['_base_/default_runtime.py', '_base_/schedules/sgd_50e.py']

# Stand-ins for the project's model, data and evaluator: the only lines that are not the project's.
model = dict(type='support.TinyNet')
loss_fn = dict(type='CrossEntropyLoss')
train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=8),
                        sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=8, seed=1),
                      sampler=dict(type='DefaultSampler', shuffle=False))
metrics = dict(acc=dict(type='Accuracy'))
progress = False
