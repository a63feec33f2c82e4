_base_ = ['model_data.py', '../openmmlab/mmdet/_base_/schedules/schedule_1x.py',
          '../openmmlab/mmpretrain/_base_/default_runtime.py']
num_samples = 176  # 44 iterations an epoch: the 500-iteration warmup ends in epoch 12
train_dataloader = dict(dataset=dict(n=num_samples))
