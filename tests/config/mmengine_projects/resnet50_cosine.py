_base_ = ['model_data.py', 'schedules/imagenet_bs256_coslr.py', '../openmmlab/mmpretrain/_base_/default_runtime.py']
