"""ampe.launch"""
