_base_ = ['model_data.py', 'schedules/imagenet_bs256_coslr.py', 'default_runtime.py']
