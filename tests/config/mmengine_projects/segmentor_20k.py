_base_ = ['model_data.py', '../openmmlab/mmseg/_base_/schedules/schedule_20k.py',
          '../openmmlab/mmseg/_base_/default_runtime.py']
