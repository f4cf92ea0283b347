from .small import *
