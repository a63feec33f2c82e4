_base_ = ['model_data.py', 'schedules/imagenet_bs1024_adamw_swin.py',
          '../openmmlab/mmpretrain/_base_/default_runtime.py']
