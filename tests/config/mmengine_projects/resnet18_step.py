_base_ = ['model_data.py', '../openmmlab/mmpretrain/_base_/schedules/imagenet_bs256.py',
          '../openmmlab/mmpretrain/_base_/default_runtime.py']
