_base_ = ['model_data.py', 'schedules/imagenet_bs256.py', 'default_runtime.py']
