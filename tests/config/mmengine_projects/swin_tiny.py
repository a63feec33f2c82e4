_base_ = ['model_data.py', 'schedules/imagenet_bs1024_adamw_swin.py', 'default_runtime.py']
