_base_ = ['model_data.py', 'schedules/schedule_20k.py', 'seg_runtime.py']
